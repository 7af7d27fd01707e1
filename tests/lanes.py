"""``make test``'s pytest: the suite in two processes at once, every test file in one of them.

Run one after another, the tests keep about one of two cores busy: much of their time is spent
waiting -- on a lease to expire, a partition to heal, a lost scheduler to be noticed, a worker
process to start. So the side process runs the modules that wait most (the fault bed across
network-namespace hosts, the stock Dask cluster) and three long ones that only compute; the main
process runs the rest. Each module starts its own clusters, hosts and stores, on ports and
folders of its own, so the two never share anything but the machine. The side process and
everything it starts run at a lower CPU priority (``SIDE_NICE``), as the embedded spot workers
do: the main process's tests that kill a worker at a chosen step keep the pace they have alone
(beside an equal-priority load, one such test once saw its request finish before the kill, and
one waited out its limit for nannies to restart killed workers), and the side takes the cycles
the main one leaves. (The SP tests once stalled beside another load: a member leaving its gloo
group did not close its connections until its group object was collected, and a peer waited out
its step timeout. Fixed in :func:`pipelines.parallel.executor.leave`; docs/results.md.)

    python tests/lanes.py [PYTEST_ARGS...]

Other arguments go to both processes; the side one's output is printed after the main one's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Seconds each took in a serial fresh-clone CI (2026-11-29): 383, 100, 88, 71, 29 -- much of
# it waiting. Beside the main process, niced, they took 727 s and the main process 877 s (a
# fresh-clone CI of babcdb8, less one failed test's wait): the GPU check's CPU path (61 s
# there, five parts since) came back beside it.
BESIDE = ("tests/pipelines/test_bench_faults.py", "tests/pipelines/test_stock_cluster.py",
          "tests/pipelines/test_cli.py", "tests/pipelines/test_digits_pin.py",
          "tests/pipelines/test_bench_objectives.py", "tests/gpu/test_check_gpu.py")
SIDE_NICE = 10   # the niceness the side process adds to its own (19 is the lowest priority)


def lanes(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """The test files of the side process and of the main one."""
    files = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))
    return [f for f in BESIDE if f in files], [f for f in files if f not in BESIDE]


def main(args: list[str]) -> int:
    beside, main_files = lanes()
    pytest = [sys.executable, "-m", "pytest", "-q"]
    with tempfile.TemporaryFile("w+") as log:
        side = subprocess.Popen([*pytest, "-p", "no:cacheprovider", *args, *beside], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: os.nice(SIDE_NICE))
        try:
            main_code = subprocess.call([*pytest, *args, *main_files], cwd=ROOT)
            side_code = side.wait()
        finally:
            if side.poll() is None:   # Ctrl-C: the side process stops too, its bed torn down
                side.send_signal(signal.SIGINT)
                side.wait()
        log.seek(0)
        print(f"\n--- beside the rest: {', '.join(beside)} ---\n{log.read()}", flush=True)
    print(f"exit codes: main {main_code}, beside it {side_code}")
    return main_code or side_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
