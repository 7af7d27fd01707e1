"""The embedded cluster's nanny and how its worker processes start.

Dask's nanny gives a closing worker process 80% of 5 s to exit, SIGKILLs it, and allows the
remaining second for the exit to be seen by its event loop -- the driver's, shared with the
scheduler and every other nanny. On a loaded 2-core machine that second passes: the close
raises ``TimeoutError`` and leaves the nanny "closing" for good, and ``SpecCluster.close`` then
fails with that error, or waits for the stuck nanny forever (bench preemption hung so after a
spot worker took a preemption notice). These nannies take ``CLOSE_S`` by default.

A spawned worker process imports torch and the project before it can run a task: about 4 s of
a core each, 13 s for a 3-worker cluster on 2 cores. With ``cluster.start_method: forkserver``
(the default where the platform has it) the processes fork from one server process that
imported :data:`WORKER_MODULES` once, so a worker -- a replaced spot worker too -- is up in a
fraction of a second. The server is a fresh interpreter that only imported modules: no thread,
event loop or open file of the driver is forked (s3fs, for one, is not fork-safe).
"""
from __future__ import annotations

import multiprocessing

import dask
from distributed import Nanny
from distributed.utils import get_mp_context

CLOSE_S = 20.0
START_METHOD_KEY = "distributed.worker.multiprocessing-method"
# What a worker imports to run the project's tasks; anything else it imports when first used.
WORKER_MODULES = ("pipelines.cluster.worker_setup", "pipelines.run.tasks",
                  "pipelines.parallel.executor", "pipelines.parallel.training", "zarr",
                  "diffusers")


class EmbeddedNanny(Nanny):
    async def close(self, timeout: float = CLOSE_S, reason: str = "nanny-close") -> str:
        return await super().close(timeout=timeout, reason=reason)

    async def kill(self, timeout: float = CLOSE_S, reason: str = "nanny-kill") -> None:
        await super().kill(timeout=timeout, reason=reason)


def usable_start_method(requested: str) -> str:
    """``requested``, or ``spawn`` where this platform cannot fork a server (Windows)."""
    return requested if requested in multiprocessing.get_all_start_methods() else "spawn"


def use_start_method(method: str) -> str:
    """Start every nanny's worker process of this (driver) process with ``method``; returns the
    method used.

    Dask reads the method from its global config each time a nanny starts a process -- a
    replacement spot worker or a restart after a kill as well, long after the cluster started
    -- so it is set for the process, not for the cluster's start alone. The forkserver's
    preload is fixed when the server starts: set here, before any process started (Dask's own
    list goes first; later calls keep it)."""
    method = usable_start_method(method)
    dask.config.set({START_METHOD_KEY: method})
    if method == "forkserver":
        context = get_mp_context()   # Dask sets its own preload once, on first use
        preload = ["distributed", *WORKER_MODULES]
        context.set_forkserver_preload(preload)
    return method
