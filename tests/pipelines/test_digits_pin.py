"""The digits results, pinned: a short run per mode gives exactly the rewards and final weights
recorded from the code before the pipeline was hardened and reshaped (``tests/golden``).

Refactors must not change what a run computes; this is where it would show. The in-process
harness (``pipelines/run/harness.py``) runs the same three modes and must give the same numbers
as the cluster. The runs go in one subprocess (``tests/golden/record_digits.py``) with torch, MKL
and oneDNN held to their portable code paths -- yet some kernel still sums in another order on
some CPUs, so the recorded values are kept per CPU flavour (vendor and widest vector extension).
On a flavour nobody recorded, the reference commit is checked out into a git work tree and run
on this machine: what this code computes must equal what the reference computes here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spotlight.config import PROJECT_ROOT

pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow]

GOLDEN = PROJECT_ROOT / "tests" / "golden" / "digits.json"
RECORDER = PROJECT_ROOT / "tests" / "golden" / "record_digits.py"
MODES = ["spotlight", "vanilla", "sync"]


def cpu_flavour(cpuinfo: str) -> str:
    """``<vendor>-<widest vector extension>``, e.g. ``GenuineIntel-avx512``, from /proc/cpuinfo."""
    vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                   if line.startswith("vendor_id")), "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                      if line.startswith("flags")), []))
    widest = next((ext for ext in ("avx512f", "avx2") if ext in flags), "sse")
    return f"{vendor}-{widest.removesuffix('f')}"


def recorded_for(flavour: str) -> dict | None:
    """The recorded results for ``flavour`` (None: not recorded on such a CPU)."""
    recorded = json.loads(GOLDEN.read_text())
    entry = recorded["cpus"].get(flavour)
    if entry is None:
        return None
    return {**recorded["cpus"][entry["base"]]["modes"], **entry["modes"]} \
        if "base" in entry else dict(entry["modes"])


def run_recorder(code_root: Path, modes: str, harness: bool) -> dict:
    """Run ``record_digits.py`` against the code under ``code_root``; its JSON lines, merged."""
    env = dict(os.environ, PYTHONPATH=str(code_root))
    done = subprocess.run([sys.executable, str(RECORDER), modes] + (["harness"] if harness else []),
                          cwd=code_root, env=env, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict = {}
    for line in done.stdout.strip().splitlines():
        out.update(json.loads(line))
    return out


def reference_on_this_machine() -> dict:
    """The reference commit's results, computed here in a throw-away git work tree."""
    commit = json.loads(GOLDEN.read_text())["reference_commit"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "reference"
        made = subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "add", "--detach",
                               str(tree), commit], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.fail(f"this CPU ({cpu_flavour(_cpuinfo())}) has no recording in {GOLDEN} and "
                        f"the reference commit {commit} could not be checked out to compute one "
                        f"({made.stderr.strip()}); run the tests from a git clone with history")
        try:
            return run_recorder(tree, ",".join(MODES), harness=False)
        finally:
            subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "remove", "--force",
                            str(tree)], capture_output=True)


def _cpuinfo() -> str:
    path = Path("/proc/cpuinfo")
    return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def expected() -> dict:
    return recorded_for(cpu_flavour(_cpuinfo())) or reference_on_this_machine()


@pytest.fixture(scope="module")
def recorded() -> dict:
    return run_recorder(PROJECT_ROOT, ",".join(MODES), harness=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_short_run_reproduces_the_recorded_digits_results(recorded, expected, mode):
    got, want = recorded[mode], expected[mode]
    assert got["rollout_reward"] == want["rollout_reward"]
    assert got["val_reward"] == want["val_reward"]
    assert got["rewards_sha256"] == want["rewards_sha256"]
    assert got["weights_sha256"] == want["weights_sha256"]


@pytest.mark.parametrize("mode", MODES)
def test_the_in_process_harness_computes_what_the_cluster_computes(recorded, expected, mode):
    got, want = recorded[f"harness-{mode}"], expected[mode]
    assert got["rollout_reward"] == want["rollout_reward"]
    assert got["val_reward"] == want["val_reward"]
    assert got["weights_sha256"] == want["weights_sha256"]


def test_the_cpu_flavour_names_vendor_and_widest_vector_extension():
    intel = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"
    amd = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx avx2\n"
    assert cpu_flavour(intel) == "GenuineIntel-avx512"
    assert cpu_flavour(amd) == "AuthenticAMD-avx2"
    assert cpu_flavour("") == "unknown-sse"
