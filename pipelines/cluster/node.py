"""Several stock ``dask worker`` processes in one pod or job, without a nanny: a worker per GPU.

    python -m pipelines.cluster.node --workers 8 -- SCHEDULER [dask worker options]

``dask worker --nworkers N`` starts its processes under nannies, and a nanny that receives
SIGTERM closes its worker -- the preemption watch of a spot worker must receive the signal
itself, to hand its requests back (:mod:`pipelines.cluster.preemption`). Kubernetes signals the
container's main process only, and SLURM the job's processes. So this launcher is the main
process: it starts ``--workers`` ``dask worker --no-nanny`` processes, each named
``NAME-i`` (and given dashboard port ``P+i`` when a port was asked), passes on every SIGTERM
and SIGINT to all of them, starts a new one in place of one that exits while the node is not
stopping (a nanny's restart), and exits when all have exited after a signal -- killing one
still running :data:`STOP_GRACE_S` after it. Each worker
claims a device of its own when the driver registers the project's set-up
(:mod:`pipelines.cluster.devices`).
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

POLL_S = 0.5
RESTART_PAUSE_S = 1.0   # a worker that dies at once is not restarted in a tight loop
# After a stop signal, how long a worker may take to close before it is killed (within
# Kubernetes' default termination grace of 30 s: the kubelet would kill it anyway).
STOP_GRACE_S = 25.0


def worker_command(args: list[str], index: int) -> list[str]:
    """The ``dask worker`` command of worker ``index`` of the node, from the node's ``args``:
    its own name and dashboard port, and no nanny."""
    out, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("--name", "--dashboard-address") and rest:
            value = rest.pop(0)
            if arg == "--name":
                value = f"{value}-{index}"
            elif value.rpartition(":")[2].isdigit() and int(value.rpartition(":")[2]) > 0:
                host, _, port = value.rpartition(":")
                value = f"{host}:{int(port) + index}"
            out += [arg, value]
        elif arg not in ("--nanny", "--no-nanny"):
            out.append(arg)
    return [sys.executable, "-m", "distributed.cli.dask_worker", *out, "--no-nanny"]


class Node:
    """The worker processes of one node and what happens to them."""

    def __init__(self, count: int, args: list[str]) -> None:
        self.count, self.args = count, args
        self.workers: dict[int, subprocess.Popen] = {}
        self.stopping, self.stop_at = False, 0.0

    def start(self, index: int) -> None:
        self.workers[index] = subprocess.Popen(worker_command(self.args, index))

    def stop(self, signum: int, _frame=None) -> None:
        """Pass the signal on to every worker, and start no new one from now on."""
        if not self.stopping:
            self.stopping, self.stop_at = True, time.monotonic()
        for worker in self.workers.values():
            if worker.poll() is None:
                worker.send_signal(signum)

    def kill_stragglers(self) -> None:
        """Kill the workers still running :data:`STOP_GRACE_S` after the stop signal."""
        for index, worker in self.workers.items():
            if worker.poll() is None:
                print(f"spotlight node: worker {index} did not stop within {STOP_GRACE_S:g} s "
                      "of the signal; killing it", file=sys.stderr, flush=True)
                worker.kill()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        for index in range(self.count):
            self.start(index)
        while True:
            exited = {i: w.returncode for i, w in self.workers.items() if w.poll() is not None}
            if self.stopping and len(exited) == len(self.workers):
                return 0   # asked to stop, and every worker has
            if self.stopping and time.monotonic() - self.stop_at > STOP_GRACE_S:
                self.kill_stragglers()
            if not self.stopping:
                for index, code in exited.items():
                    print(f"spotlight node: worker {index} exited ({code}); starting another",
                          file=sys.stderr, flush=True)
                    time.sleep(RESTART_PAUSE_S)
                    self.start(index)
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.cluster.node",
        description="Start several `dask worker --no-nanny` processes (a worker per GPU of the "
                    "node), pass SIGTERM and SIGINT on to each, and restart one that exits.")
    parser.add_argument("--workers", type=int, required=True,
                        help="worker processes to start (the node's GPUs)")
    parser.add_argument("worker_args", nargs=argparse.REMAINDER,
                        help="after --: the scheduler address and `dask worker` options")
    args = parser.parse_args(argv)
    rest = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    if args.workers < 1 or not rest:
        parser.error("give --workers N (N >= 1), then -- and the scheduler's address")
    return Node(args.workers, rest).run()


if __name__ == "__main__":
    sys.exit(main())
