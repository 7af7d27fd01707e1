"""Two `spotlight run` drivers on one store, as two teammates in two terminals would start them:
the second is refused while the first holds the run; a forced takeover fences the first."""
from __future__ import annotations

import json
import os
import signal
import subprocess

from storage import RunStore
from tests.pipelines.test_session import _spotlight_cmd, _wait_for_stage


def test_a_second_driver_is_refused_and_a_takeover_fences_the_first(tiny_run_yaml, tmp_path):
    store = tmp_path / "run"
    # Long enough that it is still running when the others start (they take seconds to import).
    first = subprocess.Popen(_spotlight_cmd("run", "--config", str(tiny_run_yaml), "--iterations",
                                            "40", "--store", str(store)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        _wait_for_stage(store, "iter-000000/iteration", first)
        second = subprocess.run(_spotlight_cmd("run", "--resume", str(store)),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"(pid {first.pid}," in second.stderr and "expires in" in second.stderr
        assert "run:" not in second.stdout   # refused before it started a cluster
        assert first.poll() is None          # and the first driver was not disturbed

        goal = _done(store) + 4   # the first may finish one or two more before it is fenced
        taker = subprocess.run(_spotlight_cmd("run", "--resume", str(store), "--takeover",
                                              "--force", "--iterations", str(goal)),
                               capture_output=True, text=True, timeout=600)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert taker.returncode == 0, taker.stdout + taker.stderr
    assert "lease: epoch 2 (took over from host " in taker.stderr
    assert f"pid {first.pid}, epoch 1)" in taker.stderr
    assert first.returncode == 6, out + err
    fenced = [line for line in err.splitlines() if line.startswith("error: fenced:")]
    assert len(fenced) == 1 and "Traceback" not in err, err

    run = RunStore.open(str(store), create=False)
    assert _done(store) >= goal
    manifest = json.loads((store / "manifest.json").read_text())
    lease = json.loads((store / "lease.json").read_text())
    assert manifest["writer_epoch"] == lease["epoch"] == 2 and lease["released"]
    taken = [e for e in run.read_events() if e["kind"] == "lease" and e.get("took_over_from")]
    assert [(e["epoch"], e["took_over_from"]["pid"]) for e in taken] == [(2, first.pid)]


def _done(store) -> int:
    """Iterations the store holds records of."""
    run = RunStore.open(str(store), create=False)
    k = 0
    while run.is_stage_done(f"iter-{k}/iteration"):
        k += 1
    return k
