"""The Dask cluster of a run: an embedded one on this machine, or an existing scheduler.

Embedded: on-demand workers carry ``resources={"gpu": 1}``, spot workers ``{"spot": 1}``; each
is a separate process (forked from a server that preloaded the project, or spawned:
``cluster.start_method``) with one thread and torch pinned to it, and every process listens on
127.0.0.1 only. Remote: ``dask worker ADDR
--resources "gpu=1"`` / ``"spot=1"`` workers, over TLS (``cluster.tls``) when the cluster spans
machines. Connecting has one hard deadline (``cluster.connect_timeout_s``) for the handshake
and the worker classes; during a run, a stage that has no worker of its class left for
``cluster.worker_wait_s`` stops the run with :class:`ClusterLostError`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.cluster.classes import GPU, SPOT, Silent, scheduler_workers, workers_by_class
from pipelines.cluster.dask_log import LOG_ENV, DaskLogRoute
from pipelines.cluster.nanny import EmbeddedCluster, EmbeddedNanny, use_start_method
from pipelines.cluster.worker_setup import spotlight_worker_setup
from spotlight.config import ClusterConfig, TLSConfig
from spotlight.modes import mode_of

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# The dashboard's Spotlight page, loaded into the scheduler it serves (named, not imported: the
# scheduler imports it; `dask scheduler --preload` takes the same name).
SPOTLIGHT_PAGE = "pipelines.observe.dashboard_page"
_WAIT_POLL_S = 0.5
_FETCH_S = 5.0   # a first fetch of finished results that takes longer is tried again


class ClusterError(RuntimeError):
    """The cluster cannot run this job; the message says what is missing and what to do."""


class ClusterLostError(ClusterError):
    """No worker of a class a stage needs is left (they died or left) and none returned."""


def scheduler_connection_closed(err: BaseException) -> bool:
    """Whether ``err`` (or what it was raised from) is Dask's "connection closed": the scheduler
    went away. Dask's ``CommClosedError`` is an ``OSError``, so without this it would read as a
    file-system error; and it can reach the driver before the client's status says "closed"."""
    from distributed.comm.core import CommClosedError  # distributed loads lazily here

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CommClosedError):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


class TaskFailedError(RuntimeError):
    """A task raised on a worker; the message names the stage, the worker class and the error."""


def task_error(exc: BaseException, what: str, resource: str) -> BaseException:
    """What to raise for a task that raised ``exc`` on a worker: the store's own refusals (full,
    read-only, corrupt, no permission) as they are, anything else as a :class:`TaskFailedError`
    naming the stage and the worker class."""
    import errno

    # Not at the top: a stock worker imports this package to unpickle the worker plugin before
    # that plugin takes Dask's spill folder `storage/`, which shadows the package, off sys.path.
    from storage import StorageError

    if isinstance(exc, (StorageError, PermissionError)) or (
            isinstance(exc, OSError)
            and exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM)):
        return exc
    hint = (" The worker cannot import Spotlight: install the same version on every worker VM "
            "(README: Running on your own cluster)." if isinstance(exc, ImportError) else "")
    error = TaskFailedError(f"{what} failed on a '{resource}' worker: {type(exc).__name__}: "
                            f"{exc}.{hint}")
    error.__cause__ = exc
    return error


class RunInterrupted(RuntimeError):
    """The run was stopped (Ctrl-C, ``Session.stop``); everything committed stays resumable."""


@dataclass
class ClusterHandle:
    """A connected client, and the embedded cluster if this process started it."""

    client: object
    cluster: object | None = None
    owns_client: bool = True
    dashboard: bool = True
    log_route: DaskLogRoute | None = None
    """Where the embedded cluster's own Dask messages go while it lives (None: nowhere else)."""

    @property
    def log_file(self) -> Path | None:
        return None if self.log_route is None else self.log_route.path

    @property
    def dashboard_link(self) -> str | None:
        if not self.dashboard:
            return None
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard (not installed, disabled)
            return None

    def workers_by_class(self) -> dict[str, list[str]]:
        """Worker names per resource class, from the scheduler's view right now."""
        return workers_by_class(scheduler_workers(self.client))

    def wait_for(self, futures: list, resource: str, stop: threading.Event, wait_s: float,
                 what: str = "", silent: Silent | None = None) -> None:
        """Wait until every future is done; stop on ``stop`` (:class:`RunInterrupted`), and
        when no worker of ``resource`` is left for ``wait_s`` (:class:`ClusterLostError`).
        ``silent``: who hears of a worker of ``resource`` unheard meanwhile, and after how long
        (:class:`spotlight.scheduling.liveness.SilenceReports`)."""
        from distributed import wait

        pending = [f for f in futures if hasattr(f, "status")]
        absence = Absence(self, resource, wait_s, what, silent)
        try:
            while True:
                if stop.is_set():
                    raise RunInterrupted(f"stopped while waiting for {what or 'tasks'}")
                try:
                    wait(pending, timeout=_WAIT_POLL_S)
                    return
                except TimeoutError:
                    absence.check()
        except BaseException:
            self.client.cancel([f for f in pending if not f.done()])
            raise

    def results(self, futures: list, resource: str, stop: threading.Event, wait_s: float,
                what: str = "", silent: Silent | None = None) -> list:
        """The results of ``futures`` once every one is done, fetched in one batch. A worker
        that dies holding a result before it is fetched makes Dask compute that task again
        (its future goes back to pending), so a fetch is tried for a bounded time and, if a
        future went back, waited for like any task: with :meth:`wait_for`'s stop and its
        limit on a worker class with no worker left. (A plain gather waited for ever for a
        result whose every worker had died.)"""
        attempt_s = _FETCH_S
        while True:
            self.wait_for(futures, resource, stop, wait_s, what, silent)
            try:
                return self.client.sync(lambda: self.client.gather(futures, asynchronous=True),
                                        callback_timeout=attempt_s)
            except TimeoutError:
                if all(getattr(f, "status", "finished") == "finished" for f in futures):
                    attempt_s *= 2   # every result still there, only slow to come: wait longer

    def client_status(self) -> str:
        """``running`` while the client has its scheduler; ``connecting``, ``closed``, ...
        after the scheduler went away."""
        return str(getattr(self.client, "status", "running"))

    def scheduler_lost(self, what: str) -> "ClusterLostError":
        return ClusterLostError(
            f"the scheduler at {self.where} stopped answering while {what} waited (client "
            f"{self.client_status()}): its host died or is cut off. What was committed stays: "
            "start a scheduler and its workers, then `spotlight run --resume RUN_URL "
            "--scheduler NEW_ADDRESS`")

    @property
    def where(self) -> str:
        return "the embedded cluster" if self.cluster is not None else \
            str(getattr(getattr(self.client, "scheduler", None), "address", "the cluster"))

    def close(self) -> None:
        try:
            if self.owns_client:
                self.client.close()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.close()
            finally:
                if self.log_route is not None:
                    self.log_route.stop()


class Absence:
    """How long a worker class has had no worker: :meth:`check` raises
    :class:`ClusterLostError` once that passes ``wait_s`` (a stage cannot go on)."""

    def __init__(self, handle: ClusterHandle, resource: str, wait_s: float, what: str,
                 silent: Silent | None = None) -> None:
        self.handle, self.resource, self.wait_s, self.what = handle, resource, wait_s, what
        self.since: float | None = None
        self.lost_since: float | None = None   # since when the scheduler does not answer
        self.silent = silent

    def check(self) -> None:
        self._check_scheduler()
        try:
            workers = scheduler_workers(self.handle.client)
        except Exception:  # noqa: BLE001 - the scheduler itself does not answer
            workers = {}
        alive = workers_by_class(workers)[self.resource]
        if self.silent is not None:
            self.silent.look(workers, self.resource, self.what)
        if alive:
            self.since = None
            return
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since >= self.wait_s:
            raise ClusterLostError(
                f"no worker with resource '{self.resource}' left on {self.handle.where} for "
                f"{self.wait_s:g} s while {self.what or 'a stage'} waited (they died or left; "
                f"see the workers' logs). Start one with `dask worker ADDR --resources "
                f"\"{self.resource}=1\"` and resume the run")


    def _check_scheduler(self) -> None:
        """A client that lost its scheduler keeps answering ``scheduler_info`` from its last
        copy (workers included), so the scheduler's loss is read from the client's state: it
        reconnects for a while ("connecting"), then gives up ("closed")."""
        status = self.handle.client_status()
        if status == "running":
            self.lost_since = None
            return
        self.lost_since = self.lost_since or time.monotonic()
        if status in ("closed", "closing", "failed") or \
                time.monotonic() - self.lost_since >= self.wait_s:
            raise self.handle.scheduler_lost(self.what or "a stage")


def worker_spec(name: str, resource: str, config: ClusterConfig,
                log_file: str | Path | None = None) -> dict:
    """One embedded worker process under its nanny; ``log_file``: where its Dask messages go."""
    threads = str(config.threads_per_worker)
    # The driver's environment now (S3 credentials, cache folders), as a spawned process would
    # inherit it: a process forked from the server would see the server's, from its start.
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if log_file is not None:
        env[LOG_ENV] = str(log_file)
    # host: the nanny, the worker and the worker's HTTP endpoint all bind loopback only; Dask
    # RPC is unauthenticated, so anything reachable from the network could run code in them.
    return {"cls": EmbeddedNanny, "options": {
        "name": name, "host": LOOPBACK, "nthreads": config.threads_per_worker,
        "resources": {resource: 1}, "memory_limit": 0, "silence_logs": 40,
        "preload": ["pipelines.cluster.worker_setup"],   # Ctrl-C is the driver's (see dask_setup)
        "env": env}}


# Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in every worker, which also freezes glibc's mmap
# threshold: each large tensor is then mmap'd and unmapped again, and the page faults doubled
# the time of a denoising step here (bench overhead: 2.3x -> see README). The embedded
# cluster's nannies leave glibc's adaptive defaults alone; on stock workers the worker plugin
# (pipelines.cluster.worker_setup) raises the thresholds back.
MALLOC_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


# An idle embedded cluster used 13% of a core here, mostly the workers' statistical profiler
# (a stack sample every 10 ms, which also takes the GIL from the task) and 20 ms event-loop
# ticks; with these it uses 1.4%. The dashboard's profile page stays empty. The worker plugin
# does the same for workers the project did not start.
QUIET_EVENT_LOOPS = {"distributed.worker.profile.enabled": False,
                     "distributed.admin.tick.interval": "1s",
                     "distributed.admin.system-monitor.interval": "2s"}


def register_worker_setup(client, config: ClusterConfig, *, embedded: bool) -> None:
    """Every worker, present and future, gets the project's set-up (imports, speed, nice)."""
    register_everywhere(client, spotlight_worker_setup(
        config.threads_per_worker, config.spot_nice if embedded else 0,
        http=config.dashboard or not embedded, devices_per_node=config.devices_per_node))


def register_everywhere(client, plugin) -> None:
    """Register a worker plugin; a worker that cannot be reached (cut off by a partition) does
    not stop the run. The scheduler keeps the plugin before it sends it out, so workers that
    join later get it; the unreachable one is found out by its requests' silence."""
    from distributed.comm.core import CommClosedError  # distributed loads lazily here

    try:
        client.register_plugin(plugin)
    except (CommClosedError, OSError) as exc:
        log.warning("cluster: worker plugin %s registered, but a worker did not answer (%s); "
                    "a cut-off worker gets no work once its requests fall silent",
                    getattr(plugin, "name", type(plugin).__name__), exc)


def _close_http_server(dask_scheduler) -> None:
    dask_scheduler.http_server.stop()


def _wait_for_workers(client, count: int, timeout: float, log_file: str | Path) -> None:
    try:
        client.wait_for_workers(count, timeout=timeout)
    except TimeoutError:   # why a worker did not start is in Dask's messages, now in the log
        raise ClusterError(f"the embedded cluster's {count} worker processes did not all start "
                           f"within {timeout:g} s; Dask's messages are in {log_file}. A loaded "
                           "machine may need a larger cluster.worker_wait_s") from None


def start_embedded(config: ClusterConfig, *, log_file: str | Path) -> ClusterHandle:
    """Start a scheduler and gpu/spot worker processes, all listening on loopback only.

    Every cluster the project starts on this machine is started here (a code-shape test holds
    every other module to it): its workers get the project's set-up (imports, speed, nice),
    and Dask's own messages of all its processes go to ``log_file``, not the console
    (:mod:`pipelines.cluster.dask_log`)."""
    import dask
    from distributed import Client, Scheduler

    spot = config.spot_workers
    workers = {f"gpu-{i}": worker_spec(f"gpu-{i}", GPU, config, log_file)
               for i in range(config.gpu_workers)}
    workers.update({f"spot-{i}": worker_spec(f"spot-{i}", SPOT, config, log_file)
                    for i in range(spot)})
    scheduler = {"cls": Scheduler, "options": {
        "host": LOOPBACK, "dashboard": config.dashboard, "dashboard_address": f"{LOOPBACK}:0",
        "preload": [*dask.config.get("distributed.scheduler.preload", []),   # the user's too
                    *([SPOTLIGHT_PAGE] if config.dashboard else [])]}}
    use_start_method(config.start_method)
    settings = {"distributed.scheduler.work-stealing": False,
                MALLOC_TRIM_KEY: None, **QUIET_EVENT_LOOPS}
    if not config.dashboard:   # no HTTP endpoint in any process at all
        settings.update({"distributed.scheduler.http.routes": [],
                         "distributed.worker.http.routes": []})
    route = DaskLogRoute(log_file).start()
    cluster = client = None
    try:
        with dask.config.set(settings):
            cluster = EmbeddedCluster(workers=workers, scheduler=scheduler, silence_logs=40)
            client = Client(cluster)
        _wait_for_workers(client, len(workers), max(config.worker_wait_s, 60.0), log_file)
        register_worker_setup(client, config, embedded=True)
        if not config.dashboard:   # Dask's scheduler always serves HTTP; close it
            client.run_on_scheduler(_close_http_server)
    except BaseException:
        try:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        finally:
            route.stop()
        raise
    return ClusterHandle(client, cluster, dashboard=config.dashboard, log_route=route)


def security(tls: TLSConfig):
    """The client's ``distributed.Security`` for ``cluster.tls`` (None without TLS)."""
    if not tls.enabled:
        return None
    from distributed import Security

    return Security(tls_ca_file=tls.ca_file, tls_client_cert=tls.cert,
                    tls_client_key=tls.key or None, require_encryption=True)


async def _identify(address: str, connection_args: dict, timeout: float) -> object:
    from distributed.comm import connect

    comm = await connect(address, timeout=timeout, **connection_args)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()
    finally:
        await comm.close()


def probe_scheduler(address: str, config: ClusterConfig, timeout: float) -> None:
    """Ask ``address`` who it is, within ``timeout`` whatever the peer does (an HTTP server,
    a closed port, a TLS mismatch); a :class:`ClusterError` saying what to check otherwise."""
    sec = security(config.tls)
    tls_hint = ("" if address.startswith("tls://") or config.tls.enabled else
                " If the scheduler requires TLS, use a tls:// address and set cluster.tls.")
    if address.startswith("tls://") and sec is None:
        raise ClusterError(f"{address} is a TLS address but no client certificate is "
                           "configured; set cluster.tls.ca_file, cluster.tls.cert and "
                           "cluster.tls.key (the files the workers use)")
    args = sec.get_connection_args("client") if sec is not None else {}

    async def bounded() -> object:
        return await asyncio.wait_for(_identify(address, args, timeout), timeout)

    try:
        reply = asyncio.run(bounded())
    except (asyncio.TimeoutError, TimeoutError):
        raise ClusterError(f"could not reach the Dask scheduler at {address}: no answer as a "
                           f"Dask scheduler within {timeout:.3g} s (cluster.connect_timeout_s). "
                           f"Is `dask scheduler` running there, on that port?{tls_hint}") from None
    except Exception as err:  # noqa: BLE001 - any failure to talk is the same answer to a user
        reason = f"{type(err).__name__}: {err}".strip()
        if "certificate" in reason.lower() or "ssl" in reason.lower() or "tls" in reason.lower():
            raise ClusterError(f"the TLS handshake with {address} failed ({reason[:300]}); check "
                               "that cluster.tls names the CA, certificate and key the cluster "
                               "was started with") from None
        raise ClusterError(f"could not reach the Dask scheduler at {address} ({reason[:300]}). "
                           f"Is `dask scheduler` running there? Check the address and port, or "
                           f"drop --scheduler to use an embedded cluster.{tls_hint}") from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise ClusterError(f"{address} answered, but not as a Dask scheduler ({reply!r:.120}); "
                           "check the address and port")


def connect(address: str, config: ClusterConfig, deadline: float | None = None) -> ClusterHandle:
    """Connect to an existing scheduler within the deadline, or a ClusterError saying why not."""
    from distributed import Client

    deadline = deadline or time.monotonic() + config.connect_timeout_s
    probe_scheduler(address, config, max(deadline - time.monotonic(), 0.1))
    try:
        client = Client(address, timeout=max(deadline - time.monotonic(), 1.0),
                        security=security(config.tls))
    except (OSError, TimeoutError) as err:
        raise ClusterError(
            f"could not reach the Dask scheduler at {address} within "
            f"{config.connect_timeout_s:g} s ({type(err).__name__}: {err}). Is `dask scheduler` "
            "running there? Check the address and port, or drop --scheduler to use an embedded "
            "cluster.") from None
    try:
        register_worker_setup(client, config, embedded=False)
    except BaseException:
        client.close()
        raise
    return ClusterHandle(client)


def check_shape(handle: ClusterHandle, mode: str, config: ClusterConfig, address: str,
                deadline: float | None = None) -> str:
    """Wait for the worker classes ``mode`` needs; returns the mode to run (a stated fallback).

    No gpu worker is always an error. No spot worker in spotlight mode is an error, or with
    ``missing_spot: sync`` a fallback to synchronous exploration on gpu workers.
    """
    deadline = deadline or time.monotonic() + config.worker_wait_s
    while True:
        have = handle.workers_by_class()
        needs_spot = mode_of(mode).needs_spot
        if have[GPU] and (have[SPOT] or not needs_spot):
            return mode
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    where = address or "the embedded cluster"
    if not have[GPU]:
        raise ClusterError(
            f"{where} has no worker with resource 'gpu' (workers: {have[SPOT] or 'none'}); "
            f"rollout, reward and training need one. Start one with "
            f"`dask worker {address or 'ADDR'} --resources \"gpu=1\" --nthreads 1`.")
    if config.missing_spot == "sync":
        return "sync"
    raise ClusterError(
        f"{where} has no worker with resource 'spot' (gpu workers: {have[GPU]}); spotlight mode "
        f"explores on spot workers. Start one with `dask worker {address or 'ADDR'} --resources "
        "\"spot=1\" --nthreads 1`, or fall back: run with --mode sync (exploration on gpu "
        "workers), --mode vanilla (no exploration), or set cluster.missing_spot: sync.")


def open_cluster(config: ClusterConfig, mode: str, *,
                 log_file: str | Path) -> tuple[ClusterHandle, str]:
    """The cluster a run uses and the mode it runs in (see :func:`check_shape`); an embedded
    one logs Dask's own messages to ``log_file``."""
    deadline = None
    if config.scheduler:   # one deadline: the handshake and the wait for the worker classes
        deadline = time.monotonic() + config.connect_timeout_s
        handle = connect(config.scheduler, config, deadline)
        # The client's own messages too (a lost scheduler is a traceback per reconnect try):
        # the run says it in one line, the details go to the log file.
        handle.log_route = DaskLogRoute(log_file).start()
    else:
        handle = start_embedded(config, log_file=log_file)
    try:
        return handle, check_shape(handle, mode, config, config.scheduler, deadline)
    except ClusterError:
        handle.close()   # closes only the client of a remote cluster
        raise
