"""Every benchmark's ``--quick`` mode through the installed ``spotlight`` command, from a folder
outside the repository, as a user runs it (``tests/pipelines/conftest.py: run_quick_bench``).

A bench whose cluster lacks the project's worker set-up works under pytest, which puts the
repository on every process's ``sys.path``, and fails for a user; only the installed command
run from elsewhere shows it. Benches with a test of their own elsewhere are listed in
``ELSEWHERE``; each registered bench is run by exactly one test.
"""
from __future__ import annotations

import math

import pytest

from pipelines.bench import BENCHES, load_benches
from tests.pipelines.conftest import run_quick_bench, spotlight_cli

pytestmark = pytest.mark.timeout(600)

ELSEWHERE = {
    "arms": "tests/pipelines/test_bench_arms.py",
    "convergence": "tests/pipelines/test_cli.py",
    "faults": "tests/pipelines/test_bench_faults.py",
    "learning": "tests/pipelines/test_cli.py",
    "scale": "tests/pipelines/test_bench_scale.py",
    "stock-workers": "tests/pipelines/test_stock_cluster.py",
    "storage": "tests/pipelines/test_bench_storage.py",
}
HERE = ("overhead", "preemption", "sharded", "simulate", "sp")


def test_every_registered_bench_has_a_quick_cli_test():
    load_benches()
    assert sorted(BENCHES) == sorted([*ELSEWHERE, *HERE])


def test_bench_sp_quick_from_outside_the_repository(tmp_path, outside_repo):
    result, done = run_quick_bench("sp", ["--rounds", "1"], outside_repo, tmp_path / "sp.json",
                                   timeout=540)
    assert result["max_abs_diff"]["sp4"] < 1e-4 and result["max_abs_diff"]["sp2"] < 1e-4
    assert result["max_abs_diff"]["after_regroup"] < 1e-4
    assert result["rounds"] == 1 and result["regroup_s"]["p50"] > 0
    assert result["worker_start"] == "forkserver"   # --quick; the full bench spawns
    assert math.isfinite(result["regroup_speedup"]) and result["regroup_speedup"] > 0
    assert result["chaos"]["completed"] == result["chaos"]["requests"]
    assert result["chaos"]["max_abs_diff"] == 0.0
    # The killed members' Dask messages are in the run's log, not on the console.
    assert "killed by signal 9" in open(result["dask_log"]).read()
    assert "distributed." not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_bench_sharded_quick_from_outside_the_repository(tmp_path, outside_repo):
    """FSDP2 over the gpu workers' training group: the step a single process takes, each
    member holding its share, and a checkpoint that resumes on another member count."""
    result, done = run_quick_bench("sharded", [], outside_repo, tmp_path / "sharded.json",
                                   timeout=540)
    assert set(result["worlds"]) == {"2", "3"}
    for world, size in result["worlds"].items():
        assert size["max_abs_diff"] <= 1e-5, size   # fp32, summed in another order
        assert len(size["bytes_per_rank"]) == int(world)
        # Each holds its shard of everything (small replicated parts: the optimizer's steps).
        assert 1 / int(world) <= size["bytes_per_rank_ratio"] < 1 / int(world) + 0.01, size
    assert [(r["written_by"], r["resumed_by"]) for r in result["resume"]] == [(2, 3), (3, 2)]
    for resumed in result["resume"]:
        assert resumed["loaded_max_abs_diff"] == 0.0   # the round trip is exact
        assert resumed["max_abs_diff"] <= 1e-6, resumed   # the next step: the sum's order
    assert [e["action"] for e in result["training_group"]] == ["form-training"] * 3
    assert "Traceback" not in done.stderr and "FSDP2" not in done.stderr, done.stderr


def test_bench_overhead_quick_from_outside_the_repository(tiny_run_yaml, tmp_path,
                                                          outside_repo):
    result, _ = run_quick_bench("overhead", ["--config", str(tiny_run_yaml)], outside_repo,
                                tmp_path / "overhead.json", timeout=540)
    for key in ("inprocess_s", "dask_s", "overhead_ratio", "exploration_overlap",
                "critical_path_ratio", "machine", "wall_s"):
        assert key in result, key
    assert result["inprocess_s"] > 0 and result["dask_s"] > 0
    assert (tmp_path / "overhead.timeline.png").stat().st_size > 0


def test_bench_preemption_quick_from_outside_the_repository(tiny_run_yaml, tmp_path,
                                                            outside_repo):
    args = ["--config", str(tiny_run_yaml), "--iterations", "2"]
    result, done = run_quick_bench("preemption", args, outside_repo,
                                   tmp_path / "preemption.json", timeout=540)
    for key in ("requests_total", "requests_lost", "identical_to_clean", "preemptions",
                "preemptions_by_stage", "machine", "wall_s"):
        assert key in result, key
    assert result["requests_total"] > 0 and result["preemptions"]["injected"]
    assert result["identical_to_clean"] is True and result["requests_lost"] == 0
    # --quick is the main scenario alone: balance and SP under kills are the full bench's.
    assert result["complete"] is True and "balance" not in result and "sp" not in result
    # Killed and noticed spot workers: Dask's tracebacks stay in the runs' logs.
    assert "Traceback" not in done.stderr and "distributed." not in done.stderr, done.stderr


def test_bench_simulate_quick_from_outside_the_repository(tiny_run_yaml, tmp_path,
                                                          outside_repo):
    """Validated against a tiny run made with `spotlight run` (its own measured run would be
    the shipped digits config, minutes to pretrain in the tests' fresh cache)."""
    run = tmp_path / "measured"
    # Two iterations after the first without validation (the last validates): one calibrates
    # the driver's seconds for the other.
    made = spotlight_cli(["run", "--config", str(tiny_run_yaml), "--store", str(run),
                          "--iterations", "4", "--set", "validation.every=1000"],
                         outside_repo, timeout=300)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    assert (run / "logs" / "dask.log").stat().st_size > 0   # the run keeps Dask's messages
    result, _ = run_quick_bench("simulate", ["--run", str(run)], outside_repo,
                                tmp_path / "simulate.json", timeout=400)
    assert result["validation"]["runs"][0]["url"] == str(run)
    assert result["validation"]["measured_s"] > 0 and result["validation"]["simulated_s"] > 0
    for key in ("speedup_vs_ondemand", "cost_ratio_vs_ondemand", "machine", "wall_s"):
        assert key in result, key
