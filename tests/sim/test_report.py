"""Systems side by side on a small scenario, and the bench's output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotlight.config import shipped_config
from spotlight.sim.config import load_sim_config
from spotlight.sim.report import implied_ratio, paper_config, simulate

SMALL = {"convergence.ondemand_iterations": 30, "max_iterations": 60}


@pytest.fixture(scope="module")
def small():
    config = load_sim_config(shipped_config("sim/qwen-image-512.yaml"), SMALL)
    return config, simulate(config, timeline_iteration=2)


def test_the_premise_spot_idles_in_training_without_exploration(small):
    _, result = small
    systems = result["systems"]
    assert systems["rlboost"]["spot_idle_share_during_training"] == 1.0
    assert systems["spotlight"]["spot_idle_share_during_training"] < 0.9
    # DiT rollouts end together: no more than one request's worth of tail on any system.
    for name in ("ondemand", "rlboost", "spotlight"):
        assert systems[name]["rollout_tail_idle_share"] < 0.1


def test_comparison_against_on_demand(small):
    _, result = small
    assert result["speedup_vs_ondemand"]["ondemand"] == 1.0
    assert result["throughput_vs_ondemand"]["rlboost"] > 1.0      # spot GPUs roll out too
    assert result["throughput_vs_ondemand"]["sync"] < 1.0         # exploration on the path
    for name, s in result["systems"].items():
        assert s["cost_usd"] == pytest.approx(
            s["cost_usd_by_market"]["ondemand"] + s["cost_usd_by_market"]["spot"])
    assert json.dumps({k: v for k, v in result.items() if k != "timelines"})


def test_paper_scenario_reaches_the_headline_it_was_given(small):
    config, result = small
    ratio = implied_ratio(config, result, 2.0)
    paper = simulate(paper_config(config, ratio).with_values(
        {"systems": ["ondemand", "spotlight"]}))
    # Iterations are whole numbers, so the headline is met to within one iteration.
    assert paper["speedup_vs_ondemand"]["spotlight"] == pytest.approx(2.0, rel=0.2)


def test_bench_writes_sweeps_and_pictures(tmp_path: Path):
    from pipelines.bench.simulate import _scenarios

    config = load_sim_config(shipped_config("sim/qwen-image-512.yaml"),
                             {"convergence.ondemand_iterations": 8, "max_iterations": 20})
    out = _scenarios(config, quick=True, out=str(tmp_path / "sim"))
    assert set(out["sweeps"]) == {"resolution", "trace", "spot_ratio", "preemption_rate",
                                  "notice_s", "cloud"}
    assert set(out["scenarios"]) == {"bench", "paper"}
    for png in out["png"].values():
        assert Path(png).stat().st_size > 10_000
