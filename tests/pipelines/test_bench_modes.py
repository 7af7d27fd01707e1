"""The mode names of bench convergence: an objective prefix, then how seeds are chosen."""
import numpy as np
import pytest

from pipelines.bench.bench_modes import (
    baseline_of,
    known_mode,
    objective_settings,
    planned_ratio,
    session_mode,
    split_mode,
    stale_of,
    timing_modes,
)
from pipelines.bench.convergence import bench_convergence
from pipelines.bench.convergence_report import best_baseline, speedup_by_mode


@pytest.mark.parametrize("mode,split,ratio,session,stale,baseline", [
    ("vanilla", (None, "vanilla"), None, "vanilla", "stale", "vanilla"),
    ("spotlight-x2", (None, "spotlight-x2"), 2, "spotlight", "stale", "vanilla"),
    ("nft-vanilla", ("nft", "vanilla"), None, "vanilla", "nft-stale", "nft-vanilla"),
    ("nft-stale", ("nft", "stale"), None, "spotlight", "nft-stale", "nft-vanilla"),
    ("nft-spotlight-x4", ("nft", "spotlight-x4"), 4, "spotlight", "nft-stale", "nft-vanilla"),
    ("fast-sync", ("fast", "sync"), None, "sync", "fast-stale", "fast-vanilla"),
    ("reuse-spotlight", ("reuse", "spotlight"), 1, "spotlight", "reuse-stale", "nft-vanilla"),
    # A planner setting changes no fixed arm: reuse-cover's planned modes plan on reuse's.
    ("reuse-cover-spotlight", ("reuse-cover", "spotlight"), 1, "spotlight", "reuse-stale",
     "nft-vanilla"),
])
def test_a_mode_name_splits_into_objective_and_seed_mode(mode, split, ratio, session, stale,
                                                          baseline):
    assert split_mode(mode) == split and planned_ratio(mode) == ratio
    assert session_mode(mode) == session and stale_of(mode) == stale
    assert baseline_of(mode) == baseline and known_mode(mode)


def test_objective_prefixes_set_their_config_and_unknown_ones_are_not_modes():
    assert objective_settings("nft-spotlight") == {"objective.kind": "nft"}
    assert objective_settings("fast-vanilla") == {"sampler.sde_window_size": 2}
    assert objective_settings("reuse-stale") == {"objective.kind": "nft",
                                                 "objective.train_on_explored": True}
    assert objective_settings("reuse-cover-spotlight")["planner.cover_candidates"] == 12
    assert objective_settings("spotlight") == {}
    assert not known_mode("dpo-vanilla") and not known_mode("nft-") and not known_mode("fast")


def test_a_planned_mode_times_its_own_objectives_stale_run_and_the_product_is_a_mode():
    assert timing_modes(["vanilla", "stale", "nft-vanilla", "nft-spotlight-x2"]) == \
        {"vanilla", "stale", "nft-vanilla", "nft-stale"}
    assert timing_modes(["nft-vanilla", "reuse-spotlight", "reuse-cover-spotlight"]) == \
        {"nft-vanilla", "reuse-stale"}
    with pytest.raises(ValueError, match=r"--product nft-spotlight is not one of --modes"):
        bench_convergence(modes=["vanilla", "stale", "spotlight"], product="nft-spotlight")


def test_exploration_on_an_objective_is_measured_against_that_objective_alone():
    """Times per seed (paired): nft-vanilla is the fastest baseline, so nft-spotlight's
    vs_best_baseline and vs_objective_alone are both nft-vanilla over it."""
    times = {"vanilla": [10.0, 12.0, 8.0], "spotlight": [5.0, 6.0, 4.0],
             "nft-vanilla": [4.0, 6.0, 2.0], "nft-spotlight": [2.0, 3.0, 2.0]}
    its = {m: [1.0, 1.0, 1.0] for m in times}
    assert best_baseline(list(times), times) == "nft-vanilla"
    by_mode = speedup_by_mode(list(times), times, its)
    nft = by_mode["nft-spotlight"]
    assert nft["vs_objective_alone"]["per_seed"] == [2.0, 2.0, 1.0]
    assert nft["vs_best_baseline"] == nft["vs_objective_alone"]
    assert nft["vs_vanilla"]["per_seed"] == [5.0, 4.0, 4.0]
    assert by_mode["spotlight"]["vs_objective_alone"]["per_seed"] == [2.0, 2.0, 2.0]
    assert by_mode["spotlight"]["vs_best_baseline"]["per_seed"] == [0.8, 1.0, 0.5]
    assert by_mode["nft-vanilla"]["vs_objective_alone"] is None
    assert by_mode["nft-vanilla"]["vs_best_baseline"] is None
    assert np.isclose(by_mode["nft-vanilla"]["vs_vanilla"]["median"], 2.5)


def ratio(median):
    return {"median": median, "ci90": [median * 0.8, median * 1.2], "per_seed": [median]}


def test_the_budget_figure_holds_each_objectives_planned_capacities_in_order(tmp_path):
    from pipelines.bench.convergence_plot import budget_curves, plot_budget, shown_ratios

    by_mode = {"spotlight-x2": {"vs_objective_alone": ratio(1.6), "vs_vanilla": ratio(1.6)},
               "spotlight": {"vs_objective_alone": ratio(1.3), "vs_vanilla": ratio(1.3)},
               "nft-spotlight": {"vs_objective_alone": ratio(1.1), "vs_vanilla": ratio(2.2)},
               "nft-vanilla": {"vs_objective_alone": None, "vs_vanilla": ratio(2.0)}}
    curves = budget_curves({"speedup_by_mode": by_mode})
    assert list(curves) == ["flow-grpo"]   # nft has one capacity only: no curve
    assert [(r, p["median"]) for r, p in curves["flow-grpo"]] == [(1, 1.3), (2, 1.6)]
    labels = [label for label, _ in shown_ratios({"speedup_by_mode": by_mode,
                                                  "product": "nft-spotlight",
                                                  "speedup_vs_vanilla": ratio(2.2)})]
    assert labels[0] == "time: vanilla / nft-spotlight"
    assert "time: nft-vanilla / nft-spotlight" in labels
    assert "time: vanilla / spotlight" in labels
    assert labels.count("time: vanilla / nft-spotlight") == 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    plot_budget(ax, curves)
    assert [line.get_label() for line in ax.containers] == ["flow-grpo"]
    plt.close(fig)
