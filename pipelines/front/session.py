"""``spotlight.Session``: submit RL iterations from Python or Jupyter, on any Dask cluster.

    session = spotlight.Session.from_config("configs/digits.yaml")
    handle = session.submit_iteration()      # returns at once; the kernel stays free
    session.run(5)                           # or block for five iterations
    session.history                          # one row per iteration (pandas)
    session.dashboard_link

Every iteration's stages are checkpointed in the run store; ``Session.resume(run_url)`` picks
a run up where it stopped, from any process.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.cluster import (
    ClusterError,
    ClusterHandle,
    ClusterLostError,
    check_shape,
    open_cluster,
    register_worker_setup,
)
from pipelines.cluster.connect import register_everywhere, scheduler_connection_closed
from pipelines.cluster.dask_log import run_log_file
from pipelines.cluster.injector import PreemptionInjector
from pipelines.cluster.preemption import preemption_watch
from pipelines.observe import Observers, build_observers
from pipelines.observe.run_view import RunView
from pipelines.run.driver import Driver, EventFn, IterationResult, RunInterrupted
from pipelines.run.tasks import prepared_base, stage_name
from spotlight.config import (
    ConfigError,
    RunConfig,
    check_files,
    config_hash,
    from_stored,
    load_config,
)
from spotlight.iteration import validation_due
from spotlight.models.base import check_policy
from spotlight.models.prompts import world_prompts
from spotlight.modes import MODE_NAMES, MODES, mode_of
from storage import RunStore, StorageError
from storage.driver_lease import DriverLease

CODE_VERSION = "spotlight-pipeline-1"


def default_store_url(config: RunConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(Path("runs") / f"{stamp}-{config_hash(config.to_dict())[:8]}")


class Session:
    """A run bound to a cluster and a run store. Use as a context manager or call ``close()``."""

    def __init__(self, config: RunConfig, store: RunStore, cluster: ClusterHandle, mode: str,
                 *, on_event: EventFn | None = None, progress: bool = False,
                 lease: DriverLease | None = None) -> None:
        self.config, self.store, self.cluster, self.mode = config, store, cluster, mode
        self.lease = lease
        self.train_prompts = world_prompts(config, "train")
        self.val_prompts = world_prompts(config, "val")
        # Spot workers hear preemption notices (SIGTERM, file, cloud metadata) and hand back.
        register_everywhere(cluster.client, preemption_watch(config.preemption))
        # Trackers and the dashboard's live page hear every event the user's callback hears.
        self.observers = Observers(build_observers(self), user=on_event)
        self.driver = Driver(config, store, cluster, mode, self.train_prompts, self.val_prompts,
                             on_event=self.observers)
        if self.lease is not None:
            self.driver.emit("lease", **self.lease.event())
        self.injector: PreemptionInjector | None = None
        if config.injector.trace or config.injector.poisson_rate_per_hour > 0:
            self.injector = PreemptionInjector(
                cluster, config.injector, config.cluster,
                on_event=lambda kind, info: self.driver.emit(kind, **info)).start()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="spotlight-driver")
        self._lock = threading.Lock()
        self._submitted = self.completed_iterations()
        self.warm_up_futures = self.driver.warm_up()   # workers load weights while the driver plans
        if lease is not None:   # renewed in the background; after a takeover this run stops
            lease.start_renewing(on_lost=lambda _: self.stop())

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def from_config(cls, path: str | Path | RunConfig, client: Any = None,
                    store: str | RunStore | None = None, *, overrides: dict | None = None,
                    mode: str | None = None, on_event: EventFn | None = None,
                    progress: bool = False, store_options: dict | None = None) -> "Session":
        """A new run from a YAML config (or a ``RunConfig``) on ``client``'s cluster or an
        embedded one."""
        if isinstance(path, RunConfig):
            config = path.with_values(overrides) if overrides else path
            check_files(config)
        else:
            config = load_config(path, overrides)
        if mode is not None:
            if mode not in MODES:
                raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODE_NAMES)}")
            config = config.with_values(mode_values(config, mode))
        # Everything is checked before anything is written: the config and its files (above),
        # the store URL (no run there yet), the cluster; only then is the run store created.
        url = store if isinstance(store, RunStore) else (store or config.store or
                                                         default_store_url(config))
        _refuse_existing_run(url)
        check_policy(config)   # weights, dtype, resolution, adapter: before any worker starts
        log = run_log_file(url.url if isinstance(url, RunStore) else url)
        try:   # a wrong address fails before pretraining
            cluster, mode = _cluster_for(config, client, log.path)
        except BaseException as err:
            if not isinstance(err, ClusterError):   # its Dask log says why the cluster failed
                log.forget()
            raise
        run_store = lease = None
        try:
            base = prepared_base(config, progress=progress)
            run_store = url if isinstance(url, RunStore) else \
                RunStore.open(url, writer=True, **(store_options or {}))
            lease = run_store.take_lease()
            run_store.record_run(config=config.to_dict(), code_version=CODE_VERSION, mode=mode,
                                 source=config.source)
            if run_store.latest_checkpoint() is None:
                run_store.save_checkpoint(0, base.state_dict(), None, metadata={"base": True})
            return cls(config, run_store, cluster, mode, on_event=on_event, progress=progress,
                       lease=lease)
        except BaseException:
            cluster.close()
            if lease is not None:
                lease.release()
            if run_store is None:
                log.forget()
            raise

    @classmethod
    def resume(cls, run_url: str | RunStore, client: Any = None, *, scheduler: str | None = None,
               connect_timeout_s: float | None = None, on_event: EventFn | None = None,
               takeover: bool = False, force: bool = False, **store_options: Any) -> "Session":
        """Reopen a run from its store and continue after its last completed stage.

        ``scheduler`` resumes on another cluster than the one recorded; nothing but the lease
        is written to the store before the cluster answers. The run's lease comes first: while
        another driver holds it this raises ``LeaseHeld`` at once; ``takeover`` takes an
        expired lease (its driver crashed or is cut off), ``force`` a live one too, and the
        other driver's writes are refused from then on. A ``RunStore`` that already holds the
        lease (:meth:`RunStore.take_lease`, as the command line takes it before it loads the
        rest of Spotlight) keeps it.
        """
        store = run_url if isinstance(run_url, RunStore) else RunStore.open(
            run_url, create=False, writer=True, **store_options)
        lease = store.lease or store.take_lease(takeover=takeover, force=force)
        try:
            return cls._resumed(store, client, scheduler, connect_timeout_s, on_event, lease)
        except BaseException:
            lease.release()
            raise

    @classmethod
    def _resumed(cls, store: RunStore, client: Any, scheduler: str | None,
                 connect_timeout_s: float | None, on_event: EventFn | None,
                 lease: DriverLease) -> "Session":
        info = store.manifest.read().get("run", {})
        if "config" not in info:
            raise ConfigError(f"{store.url} has no recorded config; it was not started by a "
                              "Session")
        config = from_stored(info["config"], info.get("source", store.url))
        changes: dict[str, Any] = {"mode": info.get("mode", config.mode)}
        if scheduler is not None:
            changes["cluster.scheduler"] = scheduler
        if connect_timeout_s is not None:
            changes["cluster.connect_timeout_s"] = connect_timeout_s
        config = config.with_values(changes)
        cluster, mode = _cluster_for(config, client, run_log_file(store.url).path)
        try:
            return cls(config, store, cluster, mode, on_event=on_event, lease=lease)
        except BaseException:
            cluster.close()
            raise

    # --- running --------------------------------------------------------------------------------
    def completed_iterations(self) -> int:
        return self.view.completed_iterations()

    def _run_one(self, k: int, target: int) -> IterationResult:
        if k > 0 and not self.store.is_stage_done(stage_name(k - 1, "iteration")):
            raise RuntimeError(f"iteration {k} cannot start: iteration {k - 1} did not complete "
                               f"(see its error); resume with Session.resume({self.url!r})")
        if k == 0:
            self.driver.validate(0)
        return self.driver.run_iteration(k, validate=validation_due(self.config, k, target),
                                         explore_next=k + 1 < target)

    def submit_iteration(self, target: int | None = None) -> concurrent.futures.Future:
        """Queue the next iteration; returns a Future at once (``.result()`` blocks for it).

        ``target`` is the run's planned length (it decides whether the last iteration explores
        for a next one and validates); default: the config's ``iterations``, at least this one.
        """
        with self._lock:
            k = self._submitted
            self._submitted += 1
        goal = max(target or self.config.iterations, k + 1)
        return self._executor.submit(self._run_one, k, goal)

    def run(self, iterations: int | None = None) -> "Any":
        """Run ``iterations`` more (default: up to the config's ``iterations``); returns history.

        A KeyboardInterrupt (Ctrl-C, or the kernel's interrupt in Jupyter) stops the run at
        once: queued iterations are dropped, the running one stops at its next wait (what it
        committed stays committed) and the interrupt is raised again; resume with
        ``Session.resume(session.url)``.
        """
        done = self._submitted
        goal = done + iterations if iterations is not None else self.config.iterations
        futures = [self.submit_iteration(goal) for _ in range(done, goal)]
        try:
            for f in futures:
                f.result()
        except KeyboardInterrupt:
            self.stop()
            raise
        except Exception as err:
            if self.lease is not None and self.lease.lost is not None:
                raise self.lease.lost from err   # stopped because another driver took over
            lost = self.cluster.client_status() != "running" or scheduler_connection_closed(err)
            if lost and not isinstance(err, ClusterLostError):   # Dask cancelled what ran
                raise self.cluster.scheduler_lost("the run") from err
            raise
        return self.history

    def stop(self) -> None:
        """Stop the run: no further iteration starts, the running one stops at its next wait."""
        self.driver.stop()
        with self._lock:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # --- what users look at ---------------------------------------------------------------------
    @property
    def view(self) -> RunView:
        """The run as its store holds it (what ``spotlight report`` reads)."""
        return RunView(self.store)

    @property
    def results(self) -> list[IterationResult]:
        return self.view.results

    @property
    def history(self):
        """Per-iteration metrics as a pandas DataFrame indexed by iteration (``.to_xarray()``
        works)."""
        import pandas as pd

        rows = [r.to_record() | {"wall_s": r.wall_s} for r in self.results]
        frame = pd.DataFrame(rows)
        return frame.set_index("iteration") if len(frame) else frame

    def task_records(self) -> list[dict]:
        """Every task of the completed iterations: stage, worker, start, end, weights version."""
        return self.view.tasks()

    def val_curve(self) -> list[dict]:
        """Validation reward by iteration (0 = the base model), with wall seconds since the
        start."""
        return self.view.val_curve()

    @property
    def base_val_reward(self) -> float | None:
        return self.view.base_val_reward

    @property
    def dashboard_link(self) -> str | None:
        return self.cluster.dashboard_link

    @property
    def dask_log(self) -> Path | None:
        """The file the embedded cluster's own Dask messages go to (``RUN/logs/dask.log`` for
        a run on a local file system); None on a cluster this session did not start."""
        return self.cluster.log_file

    @property
    def url(self) -> str:
        return self.store.url

    def __repr__(self) -> str:
        return (f"Session({self.url!r}, mode={self.mode!r}, iterations_done="
                f"{self.completed_iterations()}, dashboard={self.dashboard_link!r})")

    def close(self) -> None:
        """Stop the run if it still runs, record its events and release the cluster."""
        if self.injector is not None:
            self.injector.stop()
        self.stop()
        try:
            self._executor.shutdown(wait=True)   # the running iteration stops at its next wait
            if self.lease is None or self.lease.lost is None:
                self.driver.flush_events("close")   # what happened after the last iteration
        finally:
            self.observers.close()
            self.cluster.close()
            if self.lease is not None:
                self.lease.release()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Session", "RunInterrupted"]


def mode_values(config: RunConfig, mode: str) -> dict:
    """The config changes of running ``config`` in ``mode``: 'rlboost' also rolls out on spot
    workers unless the config already places the rollout there."""
    changes: dict[str, Any] = {"mode": mode}
    if mode_of(mode).hybrid_rollout and config.placement.rollout and \
            "spot" not in config.placement.rollout:
        changes["placement.rollout"] = [*config.placement.rollout, "spot"]
    return changes


def _refuse_existing_run(url: str | RunStore) -> None:
    """A new run never writes into a store that holds one (reads only; creates nothing)."""
    try:
        existing = url if isinstance(url, RunStore) else RunStore.open(url, create=False)
    except StorageError:
        return   # nothing there yet (an unreachable store fails when it is created)
    if existing.manifest.read().get("run", {}).get("config") and \
            existing.latest_checkpoint() is not None:
        raise ConfigError(f"{existing.url} already holds a run; resume it with "
                          f"Session.resume({existing.url!r}) or `spotlight run --resume "
                          f"{existing.url}`, or choose a new --store")


def _cluster_for(config: RunConfig, client: Any, log_file: Path) -> tuple[ClusterHandle, str]:
    if client is None:   # an embedded cluster's Dask messages go to the run's log file
        handle, mode = open_cluster(config.cluster, config.mode, log_file=log_file)
    else:
        handle = ClusterHandle(client, owns_client=False)
        address = getattr(getattr(client, "scheduler", None), "address", "") or ""
        register_worker_setup(client, config.cluster, embedded=False)
        mode = check_shape(handle, config.mode, config.cluster, address)
    try:
        _check_placement(config, handle, mode)
    except BaseException:
        handle.close()
        raise
    return handle, mode


def _check_placement(config: RunConfig, handle: ClusterHandle, mode: str) -> None:
    """Every stage has at least one worker of a class it may run on. (Stale exploration with
    no spot worker is ``cluster.missing_spot``'s to decide.)"""
    present = handle.workers_by_class()
    mode_ = mode_of(mode)
    stages = ("rollout", "reward", "train") + (("explore",) if mode_.explores and not mode_.stale
                                              else ())
    for stage in stages:
        classes = config.placed(stage, mode)
        if not any(present.get(c) for c in classes):
            raise ConfigError(
                f"placement.{stage} = {list(classes)}, but the cluster at {handle.where} has no "
                f"worker of those classes (it has {dict((c, len(n)) for c, n in present.items())}"
                f"); start one (dask worker ADDR --resources \"{classes[0]}=1\") or add a class "
                f"it has to placement.{stage}")
