"""The workers of ``spotlight bench scale``: many real Dask workers in one process, and the
request they run.

The request is a denoising loop whose step is a fixed wait -- the bench's timing model, in
place of a model's compute -- that commits every step's latent to the run store through the
same sink, claim and fencing token as a real request. Hundreds of workers fit on two cores that
way, so what grows with their number is the control plane alone: the scheduler, the driver's
dispatch pool, the store's markers and the lease.

    python -m pipelines.bench.scale_hosts SCHEDULER --gpu N --spot M --prefix NAME --dir DIR

Each worker is a ``distributed.Worker`` with one thread and the resource of its class, all on
one event loop; the process prints ``ready`` once every one has joined, and stops its workers
on SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

import numpy as np

from pipelines.cluster import GPU, SPOT
from storage import RunStore, operations
from storage.attempts import Attempt

LATENT_SHAPE = (1, 4, 4)   # a request's latent: small, the store's cost is per object


def timed_request(store: RunStore, stage: str, request: str, steps: int, step_s: float, *,
                  attempt: tuple[int, int]) -> dict:
    """``steps`` denoising steps of ``step_s`` seconds each, every latent committed to
    ``store``; when it started and ended on which worker (the bench's dispatch latency)."""
    from distributed import get_worker

    started = time.time()
    latent = np.zeros(LATENT_SHAPE, np.float32)
    point = store.resume_point(stage, request)   # as a real request: on from its last commit
    first = 0 if point is None else point.step + 1
    with store.latent_sink(stage) as sink:
        for step in range(first, steps + 1):
            if step:
                time.sleep(step_s)
            sink.commit(request, step, latent + step, num_steps=steps, weights_version=0,
                        attempt=Attempt(*attempt))
    return {"worker": get_worker().name, "started": started, "ended": time.time()}


def process_operations() -> tuple[int, dict[str, int]]:
    """This process's store operations so far, with its pid (workers share a process)."""
    return os.getpid(), operations.operations()


# Services every Dask worker runs for its own process, which workers sharing a process would
# each run for all of them: the statistical profiler (every 10 ms, each sampling every thread of
# the process), the event loop's tick measurement (every 20 ms) and the system monitor. On a
# worker's own machine they cost it ~1%; 32 to a process they cost a quarter of a core idle,
# which is the bench's, not the product's.
SHARED_PROCESS = {"distributed.worker.profile.enabled": False,
                  "distributed.admin.tick.interval": "1s",
                  "distributed.admin.system-monitor.interval": "5s"}


async def serve(scheduler: str, gpu: int, spot: int, prefix: str, directory: str) -> None:
    import dask
    from distributed import Worker

    dask.config.set(SHARED_PROCESS)
    classes = [GPU] * gpu + [SPOT] * spot
    workers = [Worker(scheduler, nthreads=1, resources={cls: 1}, memory_limit=0,
                      name=f"{prefix}-{cls}-{i:03d}", local_directory=directory,
                      dashboard=False)
               for i, cls in enumerate(classes)]
    await asyncio.gather(*workers)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await asyncio.gather(*(w.close(timeout=5) for w in workers), return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scheduler")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--spot", type=int, default=0)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.scheduler, args.gpu, args.spot, args.prefix, args.dir))


if __name__ == "__main__":
    main()
