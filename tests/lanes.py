"""``make test``'s pytest: the suite in two processes, every test file in one of them.

The side process runs the fault bed's module (six runs across network-namespace hosts, about
5 minutes, much of it waiting on leases, heals and a lost scheduler) and three long modules
that only compute. The main process runs the rest; it ends with the modules that slow most
beside another load (an embedded run's dashboard, a driver killed and resumed), then the tests
that form SP groups, by when the side process is done: beside another load their elastic groups
once stalled for minutes (docs/results.md). Other arguments go to both.

    python tests/lanes.py [PYTEST_ARGS...]
"""
from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BESIDE = ("tests/pipelines/test_bench_faults.py", "tests/pipelines/test_digits_pin.py",
          "tests/gpu/test_check_gpu.py", "tests/pipelines/test_cli.py")
LATE = ("tests/observe/test_dashboard.py", "tests/pipelines/test_session.py")
SP = ("tests/parallel/", "tests/pipelines/test_bench_cli.py",
      "tests/pipelines/test_sp_rollout.py")


def lanes(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """The test files of the side process and, in order, of the main one."""
    files = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))
    last = [f for f in LATE if f in files] + [f for f in files if f.startswith(SP)]
    main = [f for f in files if f not in BESIDE and f not in last] + last
    return [f for f in BESIDE if f in files], main


def main(args: list[str]) -> int:
    beside, main_files = lanes()
    pytest = [sys.executable, "-m", "pytest", "-q"]
    with tempfile.TemporaryFile("w+") as log:
        side = subprocess.Popen([*pytest, "-p", "no:cacheprovider", *args, *beside], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
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
