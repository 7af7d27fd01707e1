"""The digits results, pinned: a short run per mode gives exactly the rewards and final weights
recorded from the code before the pipeline was hardened and reshaped (``tests/golden``).

Refactors must not change what a run computes; this is where it would show. The in-process
harness (``pipelines/run/harness.py``) runs the same three modes and must give the same numbers
as the cluster. The runs go in one subprocess (``tests/golden/record_digits.py``) with torch and MKL held to their portable code
paths, so that the pin does not depend on the CPU's vector extensions.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import PROJECT_ROOT

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


def golden() -> dict:
    """The recorded results for this CPU: the AVX2 recording, with the exploring modes'
    AVX-512 recording on a CPU that has AVX-512 (see ``digits.json``'s notes)."""
    recorded = json.loads((PROJECT_ROOT / "tests" / "golden" / "digits.json").read_text())
    modes = dict(recorded["modes"])
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx512f" in flags:
        modes.update(recorded["avx512"]["modes"])
    return modes


GOLDEN = golden()
RECORDER = PROJECT_ROOT / "tests" / "golden" / "record_digits.py"
MODES = ["spotlight", "vanilla", "sync"]


@pytest.fixture(scope="module")
def recorded() -> dict:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    done = subprocess.run([sys.executable, str(RECORDER), ",".join(MODES), "harness"],
                          cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict = {}
    for line in done.stdout.strip().splitlines():
        out.update(json.loads(line))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_a_short_run_reproduces_the_recorded_digits_results(recorded, mode):
    got, expected = recorded[mode], GOLDEN[mode]
    assert got["rollout_reward"] == expected["rollout_reward"]
    assert got["val_reward"] == expected["val_reward"]
    assert got["rewards_sha256"] == expected["rewards_sha256"]
    assert got["weights_sha256"] == expected["weights_sha256"]


@pytest.mark.parametrize("mode", MODES)
def test_the_in_process_harness_computes_what_the_cluster_computes(recorded, mode):
    got, expected = recorded[f"harness-{mode}"], GOLDEN[mode]
    assert got["rollout_reward"] == expected["rollout_reward"]
    assert got["val_reward"] == expected["val_reward"]
    assert got["weights_sha256"] == expected["weights_sha256"]
