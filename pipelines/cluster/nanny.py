"""The embedded cluster's nanny and how its worker processes start.

Dask's nanny gives a closing worker process 80% of 5 s to exit, SIGKILLs it, and allows the
remaining second for the exit to be seen by its event loop -- the driver's, shared with the
scheduler and every other nanny. On a loaded 2-core machine that second passes: the close
raises ``TimeoutError`` and leaves the nanny "closing" for good, and ``SpecCluster.close`` then
fails with that error, or waits for the stuck nanny forever (bench preemption hung so after a
spot worker took a preemption notice). These nannies take ``CLOSE_S`` by default.

``SpecCluster`` closes a worker's nanny for good when, ``distributed.deploy.lost-worker-timeout``
(15 s) after one of its worker processes left, no worker of that name is registered. A nanny
restarts a killed worker in about a second; if the same worker is killed again just before a
timer from its previous loss fires, the check lands in that second and the cluster is one
worker short from then on (seen in CI: ``bench sp`` kills a worker, then the same one 15 s
later, and was left with no SP group). :class:`EmbeddedCluster` leaves a nanny that is still
restarting its worker alone; one that will not restart (a spot worker preempted for good) is
cleaned up as before.

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
from distributed import Nanny, SpecCluster
from distributed.utils import get_mp_context

CLOSE_S = 20.0
START_METHOD_KEY = "distributed.worker.multiprocessing-method"
# What every worker imports to run the project's tasks. The digits policy is diffusers'
# QwenImageTransformer2DModel, so every policy -- digits, Qwen-Image -- imports diffusers (with
# torch's compiler stack and peft, about 3 s of a core); preloaded, a worker forks with it done.
WORKER_MODULES = ("distributed", "pipelines.cluster.worker_setup", "pipelines.run.tasks",
                  "pipelines.parallel.executor", "pipelines.parallel.training", "zarr",
                  "spotlight.models.policy")


class EmbeddedNanny(Nanny):
    async def close(self, timeout: float = CLOSE_S, reason: str = "nanny-close") -> str:
        return await super().close(timeout=timeout, reason=reason)

    async def kill(self, timeout: float = CLOSE_S, reason: str = "nanny-kill") -> None:
        await super().kill(timeout=timeout, reason=reason)


class EmbeddedCluster(SpecCluster):
    def _update_worker_status(self, op, msg):
        if op == "remove":
            name = self.scheduler_info["workers"].get(msg, {}).get("name")
            nanny = self.workers.get(name)
            if nanny is not None and nanny.status.name == "running":
                # Skip SpecCluster's delayed close: this nanny brings its worker back.
                super(SpecCluster, self)._update_worker_status(op, msg)
                return
        super()._update_worker_status(op, msg)


def use_start_method(method: str) -> None:
    """Start every nanny's worker process of this (driver) process with ``method`` (``spawn``
    where the platform cannot fork a server: Windows).

    Dask reads the method from its global config each time a nanny starts a process -- a
    replacement spot worker or a restart after a kill as well, long after the cluster started
    -- so it is set for the process, not for the cluster's start alone. The forkserver's
    preload is fixed when the server starts: set here, before any process started (Dask sets
    its own list on first use, so it is asked first and this list replaces it)."""
    if method not in multiprocessing.get_all_start_methods():
        method = "spawn"
    dask.config.set({START_METHOD_KEY: method})
    if method == "forkserver":
        get_mp_context().set_forkserver_preload(list(WORKER_MODULES))
