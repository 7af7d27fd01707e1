"""bench arms: the spread a selection buys, judged by the fresh replay of the seeds it keeps."""
import numpy as np

from pipelines.bench.arms import random_spread, selected_spread, summarize_arms
from tests.pipelines.conftest import run_quick_bench
from tests.pipelines.test_cli import tiny_yaml  # noqa: F401 - the fixture


def pools():
    # One prompt, 8 candidates: fresh rewards; the stale ranking reverses them.
    seeds = list(range(100, 108))
    fresh = [(seeds, [0.0, 1.0, 0.5, 0.5, 0.4, 0.6, 0.5, 0.5])]
    reversed_ = [(seeds, [1.0, 0.0, 0.5, 0.5, 0.6, 0.4, 0.5, 0.5])]
    return fresh, reversed_


def test_a_fresh_ranking_keeps_the_extremes_and_their_spread_is_judged_fresh():
    fresh, reversed_ = pools()
    # G = 2 from all 8 by the fresh scores: 0.0 and 1.0, std 0.5.
    assert selected_spread(0, 3, fresh, fresh, 8, 2) == 0.5
    # A ranking that agrees on which two are extreme picks the same pair.
    assert selected_spread(0, 3, reversed_, fresh, 8, 2) == 0.5
    # Among the first 2 candidates there is nothing to choose: the same pair again.
    assert selected_spread(0, 3, fresh, fresh, 2, 2) == 0.5
    # From candidates 3-6 alone (arm 4 of a pool that starts there) less spread is there.
    shifted = [(s[2:], r[2:]) for s, r in fresh]
    assert selected_spread(0, 3, shifted, shifted, 4, 2) == np.std([0.4, 0.6])


def test_random_groups_are_the_pools_disjoint_runs_of_g():
    fresh, _ = pools()
    expected = np.mean([np.std([0.0, 1.0]), np.std([0.5, 0.5]), np.std([0.4, 0.6]),
                        np.std([0.5, 0.5])])
    assert random_spread(fresh, 2) == expected


def test_the_summary_takes_medians_over_probes_and_skips_missing_values():
    result = {"probes": [
        {"tau": {"1": 0.8, "2": None}, "spread_gain": {"fresh": {"16": 1.2, "32": 1.4}}},
        {"tau": {"1": 0.6, "2": 0.5}, "spread_gain": {"fresh": {"16": 1.0, "32": None}}}]}
    out = summarize_arms(result)
    assert out["median_tau"] == {"1": 0.7, "2": 0.5}
    assert out["median_spread_gain"] == {"fresh": {"16": 1.1, "32": 1.4}}


def test_bench_arms_quick_probes_fresh_and_stale_rankings(tiny_yaml, tmp_path,  # noqa: F811
                                                          outside_repo):
    """Through the installed command on a tiny world (the shipped base would be pretrained
    first: minutes). Its rewards are all zero, so no spread or τ is defined there: the figures
    are checked above, this checks what is probed and written."""
    result, _ = run_quick_bench("arms", ["--config", str(tiny_yaml), "--set",
                                         "objective.kind=nft"], outside_repo,
                                tmp_path / "arms.json", timeout=540)
    # The JSON says what the weights were trained with.
    assert result["objective"] == "nft" and result["overrides"] == {"objective.kind": "nft"}
    assert [p["iteration"] for p in result["probes"]] == [1, 2]
    assert result["arms"] == [6, 8, 12, 16] and result["pool"] == 16
    # Iteration 1 can be ranked one version stale, iteration 2 also two.
    assert [sorted(p["tau"]) for p in result["probes"]] == [["1"], ["1", "2"]]
    assert sorted(result["probes"][1]["spread_gain"]) == ["fresh", "stale-1", "stale-2"]
    assert all(sorted(g) == ["12", "16", "6", "8"]
               for p in result["probes"] for g in p["spread_gain"].values())
    assert set(result["median_spread_gain"]) == {"fresh", "stale-1", "stale-2"}
