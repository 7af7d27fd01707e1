"""Max-variance seed selection against brute force, tie-breaking and filling."""
import itertools

import numpy as np
import pytest

from spotlight.exploration import fill_seeds, max_variance_subset, select_seeds


@pytest.mark.parametrize("trial", range(40))
def test_max_variance_subset_matches_brute_force(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(2, 9))
    size = int(rng.integers(1, n + 1))
    rewards = rng.choice([0.0, 0.25, 0.5, 1.0], size=n) if trial % 2 else rng.random(n)
    seeds = rng.permutation(1000)[:n]
    chosen = max_variance_subset(rewards, seeds, size)
    best = max(np.var(rewards[list(c)]) for c in itertools.combinations(range(n), size))
    assert len(set(chosen.tolist())) == size
    assert np.var(rewards[chosen]) == pytest.approx(best, abs=1e-12)


def test_ties_are_broken_the_same_way_whatever_the_input_order():
    rewards = np.array([0.0, 1.0, 0.0, 1.0, 0.5, 0.0])
    seeds = np.array([11, 12, 13, 14, 15, 16])
    first = seeds[max_variance_subset(rewards, seeds, 2)]
    order = np.array([5, 3, 1, 0, 4, 2])
    second = seeds[order][max_variance_subset(rewards[order], seeds[order], 2)]
    assert sorted(first.tolist()) == sorted(second.tolist()) == [11, 14]


def test_too_few_candidates_are_topped_up_with_fresh_seeds_and_counted():
    fresh = np.array([[7, 8, 9, 10], [1, 2, 3, 4]])
    sel = select_seeds([(np.array([7, 50]), np.array([0.0, 1.0])),
                        (np.array([1, 2, 3, 4, 5]), np.array([0.0, 0.2, 0.9, 1.0, 0.5]))], 4, fresh)
    assert sel.seeds[0].tolist() == [7, 50, 8, 9] and sel.filled.tolist() == [2, 0]
    assert sel.explored.tolist() == [2, 5]
    assert np.isnan(sel.selected_rewards[0, 2:]).all()
    assert sorted(sel.selected_rewards[1].tolist()) == [0.0, 0.2, 0.9, 1.0]
    again = type(sel).from_record(sel.to_record())
    np.testing.assert_array_equal(again.seeds, sel.seeds)


def test_fill_refuses_when_fresh_seeds_run_out():
    with pytest.raises(ValueError, match="need 3 seeds"):
        fill_seeds(np.array([1]), 3, np.array([1]))


def test_the_selection_rules_keep_the_best_or_evenly_spaced_ranks():
    """Nine candidates, rewards 0.0 .. 0.8 in scrambled order: 'top' keeps the three best,
    'quantiles' the worst, the median and the best; 'max-variance' the extremes."""
    rewards = np.array([0.4, 0.8, 0.0, 0.6, 0.2, 0.7, 0.1, 0.5, 0.3])
    seeds = np.arange(100, 109)
    chosen = {rule: sorted(select_seeds([(seeds, rewards)], 3, seeds[None], rule)
                           .selected_rewards[0].tolist())
              for rule in ("top", "quantiles", "max-variance")}
    assert chosen["top"] == [0.6, 0.7, 0.8]
    assert chosen["quantiles"] == [0.0, 0.4, 0.8]
    assert chosen["max-variance"] in ([0.0, 0.1, 0.8], [0.0, 0.7, 0.8])
    top = select_seeds([(seeds, rewards)], 3, seeds[None], "top")
    assert sorted(top.seeds[0].tolist()) == [101, 103, 105]   # the seeds of those rewards


def test_the_config_offers_exactly_the_rules_selection_knows():
    from spotlight.config import ExplorationConfig
    from spotlight.config.base import ConfigError
    from spotlight.exploration.selection import SUBSET_RULES

    for rule in SUBSET_RULES:
        assert ExplorationConfig(selection=rule).selection == rule
    with pytest.raises(ConfigError, match="selection"):
        ExplorationConfig(selection="best")
