"""The Dask cluster of a run: an embedded one on this machine, or an existing scheduler.

Embedded: on-demand workers carry ``resources={"gpu": 1}``, spot workers ``{"spot": 1}``; each
is a separate process (spawned, because s3fs is not fork-safe) with one thread and torch
pinned to it. Remote: ``dask worker ADDR --resources "gpu=1"`` / ``"spot=1"`` workers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from spotlight.config import ClusterConfig

GPU, SPOT = "gpu", "spot"


class ClusterError(RuntimeError):
    """The cluster cannot run this job; the message says what is missing and what to do."""


@dataclass
class ClusterHandle:
    """A connected client, and the embedded cluster if this process started it."""

    client: object
    cluster: object | None = None
    owns_client: bool = True

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard (not installed, disabled)
            return None

    def workers_by_class(self) -> dict[str, list[str]]:
        """Worker names per resource class, from the scheduler's view right now."""
        return workers_by_class(self.client.scheduler_info(n_workers=-1)["workers"])

    def close(self) -> None:
        try:
            if self.owns_client:
                self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()


def workers_by_class(workers: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {GPU: [], SPOT: []}
    for info in workers.values():
        resources = info.get("resources", {})
        for cls in (GPU, SPOT):
            if resources.get(cls, 0) > 0:
                out[cls].append(str(info.get("name", info.get("id"))))
    return out


def _worker_spec(name: str, resource: str, config: ClusterConfig) -> dict:
    from distributed import Nanny

    threads = str(config.threads_per_worker)
    return {"cls": Nanny, "options": {
        "name": name, "nthreads": config.threads_per_worker, "resources": {resource: 1},
        "memory_limit": 0, "silence_logs": 40, "env": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}}}


# Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in every worker, which also freezes glibc's mmap
# threshold: each large tensor is then mmap'd and unmapped again, and the page faults doubled
# the time of a denoising step here (bench overhead: 2.3x -> see README). Leave glibc's
# adaptive defaults alone; memory is bounded by our own fixed-shape requests.
MALLOC_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


# An idle embedded cluster used 13% of a core here, mostly the workers' statistical profiler
# (a stack sample every 10 ms, which also takes the GIL from the task) and 20 ms event-loop
# ticks; with these it uses 1.4%. The dashboard's profile page stays empty.
QUIET_EVENT_LOOPS = {"distributed.worker.profile.enabled": False,
                     "distributed.admin.tick.interval": "1s",
                     "distributed.admin.system-monitor.interval": "2s"}


def _lower_spot_priority(nice: int):
    """A worker plugin: spot workers of an embedded cluster yield the CPU to everything else."""
    from distributed import WorkerPlugin

    class LowerSpotPriority(WorkerPlugin):
        name = "spotlight-spot-priority"

        def __init__(self, nice: int) -> None:
            self.nice = nice

        def setup(self, worker) -> None:
            import os

            if worker.state.total_resources.get(SPOT, 0) > 0 and self.nice:
                os.nice(self.nice)

    return LowerSpotPriority(nice)


def start_embedded(config: ClusterConfig) -> ClusterHandle:
    """Start a scheduler and gpu/spot worker processes on loopback."""
    import dask
    from distributed import Client, Scheduler, SpecCluster

    spot = config.spot_workers
    workers = {f"gpu-{i}": _worker_spec(f"gpu-{i}", GPU, config) for i in range(config.gpu_workers)}
    workers.update({f"spot-{i}": _worker_spec(f"spot-{i}", SPOT, config) for i in range(spot)})
    scheduler = {"cls": Scheduler, "options": {
        "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0" if config.dashboard else None}}
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn",
                          "distributed.scheduler.work-stealing": False,
                          MALLOC_TRIM_KEY: None, **QUIET_EVENT_LOOPS}):
        cluster = SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40)
        client = Client(cluster)
    client.wait_for_workers(len(workers), timeout=max(config.worker_wait_s, 60.0))
    client.register_plugin(_lower_spot_priority(config.spot_nice))
    return ClusterHandle(client, cluster)


def connect(address: str, config: ClusterConfig) -> ClusterHandle:
    """Connect to an existing scheduler, failing fast with a useful message if it is not there."""
    from distributed import Client

    try:
        client = Client(address, timeout=config.connect_timeout_s)
    except (OSError, TimeoutError) as err:
        raise ClusterError(
            f"could not reach the Dask scheduler at {address} within {config.connect_timeout_s:g} s "
            f"({type(err).__name__}: {err}). Is `dask scheduler` running there? Check the address "
            "and port, or drop --scheduler to use an embedded cluster.") from None
    return ClusterHandle(client)


def check_shape(handle: ClusterHandle, mode: str, config: ClusterConfig, address: str) -> str:
    """Wait for the worker classes ``mode`` needs; returns the mode to run (a stated fallback).

    No gpu worker is always an error. No spot worker in spotlight mode is an error, or with
    ``missing_spot: sync`` a fallback to synchronous exploration on gpu workers.
    """
    deadline = time.monotonic() + config.worker_wait_s
    while True:
        have = handle.workers_by_class()
        needs_spot = mode == "spotlight"
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


def open_cluster(config: ClusterConfig, mode: str) -> tuple[ClusterHandle, str]:
    """The cluster a run uses and the mode it runs in (see :func:`check_shape`)."""
    if config.scheduler:
        handle = connect(config.scheduler, config)
    else:
        handle = start_embedded(config)
    try:
        return handle, check_shape(handle, mode, config, config.scheduler)
    except ClusterError:
        handle.close()   # closes only the client of a remote cluster
        raise
