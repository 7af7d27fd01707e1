"""``spotlight bench scale``: the control plane's costs as workers grow, and the arithmetic of
its figures. The bench's quick mode runs here from outside the repository, as a user runs it:
a stock scheduler, real workers many to a process, every request through the dispatch pool and
the run store (file and S3)."""
from __future__ import annotations

import pytest

from pipelines.bench.scale import dispatch_latencies, latency_quantiles, scaling_checks
from tests.pipelines.conftest import run_quick_bench, spotlight_cli

pytestmark = pytest.mark.timeout(600)


def test_dispatch_latency_is_how_long_each_worker_waited_for_its_next_request():
    results = {"a": {"worker": "w1", "started": 10.5, "ended": 14.0},
               "b": {"worker": "w1", "started": 14.25, "ended": 18.0},
               "c": {"worker": "w2", "started": 11.0, "ended": 15.0},
               "d": {"worker": "w2", "started": 14.9, "ended": 16.0}}   # clocks a hair apart
    assert sorted(dispatch_latencies(results, began=10.0)) == [0.0, 0.25, 0.5, 1.0]
    assert latency_quantiles([0.0, 0.25, 0.5, 1.0])["max"] == 1.0


def test_the_checks_set_the_largest_size_against_the_smallest():
    sizes = {"8": {"iteration_s": 16.5, "ideal_s": 16.0, "driver_cpu_s_per_request": 0.01,
                   "store_reads_per_s_per_request": 0.2},
             "256": {"iteration_s": 18.0, "ideal_s": 16.0, "driver_cpu_s_per_request": 0.03,
                     "store_reads_per_s_per_request": 0.1}}
    checks = scaling_checks(sizes)
    assert (checks["largest"], checks["smallest"]) == ("256", "8")
    assert checks["iteration_within_10pct"] is False   # 18 > 17.6
    assert checks["driver_cpu_per_request_ratio"] == pytest.approx(3.0)
    assert checks["store_reads_per_s_per_request_ratio"] == pytest.approx(0.5)
    assert scaling_checks({"8": sizes["8"]}) == {}


def test_bench_scale_quick_from_outside_the_repository(tmp_path, outside_repo):
    result, done = run_quick_bench("scale", [], outside_repo, tmp_path / "scale.json",
                                   timeout=540)
    assert result["complete"] and set(result["sizes"]) == {"2", "4"}
    assert set(result["s3"]["sizes"]) == {"2", "4"}
    model = result["model"]
    for figures in [*result["sizes"].values(), *result["s3"]["sizes"].values()]:
        for run in figures["iterations"]:
            workers = run["requests"] // model["requests"]
            assert run["requests"] == model["requests"] * workers
            # No worker runs two requests at once: the work bounds the time from below.
            assert run["iteration_s"] >= model["ideal_s"] * 0.999
            assert 0 < run["running_requests"] <= workers + 1e-6
            # Every step's latent reached the store; the driver read its markers and lease.
            assert run["store_workers"]["write"] >= run["requests"] * (model["steps"] + 1)
            assert run["store_driver"]["read"] > 0 and run["store_reads_per_s_per_request"] > 0
            assert run["driver_cpu_s"] > 0 and run["scheduler_cpu_s"] >= 0
            assert set(run["dispatch_latency_s"]) == {"p50", "p95", "max"}
    assert set(result["checks"]["file"]) >= {"iteration_within_10pct",
                                            "driver_cpu_per_request_ratio"}
    # The largest size's dispatch delay fed into the paper-scale simulation: every system
    # pays it, on-demand included.
    sim = result["simulator"]
    assert sim["from_size"] in {"2", "4"} and sim["dispatch_s"] >= 0
    for name in ("without", "with"):
        assert sim[name]["speedup_vs_ondemand"]["ondemand"] == 1.0
        assert sim[name]["time_to_target_h"]["spotlight"] > 0
    assert sim["with"]["time_to_target_h"]["ondemand"] >= \
        sim["without"]["time_to_target_h"]["ondemand"]
    assert "Traceback" not in done.stderr, done.stderr


def test_several_worker_counts_are_for_bench_scale_only(tmp_path):
    done = spotlight_cli(["bench", "sharded", "--workers", "2,4"], tmp_path, timeout=60)
    assert done.returncode == 2 and "--workers takes one count for 'bench sharded'" in done.stderr
    done = spotlight_cli(["bench", "scale", "--workers", "8,x"], tmp_path, timeout=60)
    assert done.returncode == 2 and "counts joined by commas" in done.stderr
