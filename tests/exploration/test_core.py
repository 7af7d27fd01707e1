"""The exploration core: candidates, gathering, selection by source, the audit."""
from __future__ import annotations

import numpy as np
import pytest

from spotlight.exploration.core import (
    Scored,
    audit_candidates,
    audit_steps,
    audit_tau,
    candidate_seeds,
    first_drawn,
    gather,
    request_chunks,
    selection_of,
)
from spotlight.exploration.planner import Plan
from spotlight.rl.trainer import random_seeds


def test_candidates_are_deterministic_and_not_the_rollouts_seeds():
    a = candidate_seeds(3, 5, prompts=2, candidates=8)
    assert a.shape == (2, 8) and np.array_equal(a, candidate_seeds(3, 5, 2, 8))
    assert not np.array_equal(a[:, :4], random_seeds(3, 5, 2, 4))
    assert not np.array_equal(a, candidate_seeds(3, 6, 2, 8))


def test_requests_cut_the_candidates_into_fixed_batches():
    assert request_chunks(8, 3) == [(0, 0), (1, 3), (2, 6)]
    assert request_chunks(6, 6) == [(0, 0)]


def test_gather_orders_by_prompt_and_chunk_and_leaves_unfinished_requests_out():
    outs = [Scored(1, 1, np.array([13, 14]), np.array([0.3, 0.4])),
            Scored(0, 0, np.array([1, 2]), np.array([0.1, 0.2])),
            Scored(1, 0, np.array([11, 12]), np.array([0.1, 0.2]))]   # prompt 0's chunk 1 lost
    assert gather(outs, 3) == [([1, 2], [0.1, 0.2]),
                               ([11, 12, 13, 14], [0.1, 0.2, 0.3, 0.4]), ([], [])]


def test_each_source_selects_from_its_own_candidates():
    per_prompt = [([10, 11, 12, 13], [0.5, 0.9, 0.1, 0.6]), ([20, 21, 22, 23], [0.2] * 4)]
    explored = selection_of("explore", 0, 4, 2, 2, per_prompt)
    assert sorted(explored.seeds[0].tolist()) == [11, 12]   # the extremes of prompt 0
    assert set(explored.seeds[1].tolist()) <= {20, 21, 22, 23}
    assert np.array_equal(selection_of("sync", 0, 4, 2, 2, per_prompt).seeds, explored.seeds)
    fallback = selection_of("fallback-random", 0, 4, 2, 2, per_prompt)
    assert sorted(fallback.seeds[0].tolist()) == [10, 11]   # only the first G were drawn
    assert first_drawn(per_prompt, 2)[1] == ([20, 21], [0.2, 0.2])
    plain = selection_of("random", 0, 4, 2, 2, None)
    assert np.array_equal(plain.seeds, random_seeds(0, 4, 2, 2))
    assert np.isnan(plain.selected_rewards).all()


def test_a_prompt_explored_short_fills_up_with_fresh_random_seeds():
    chosen = selection_of("explore", 0, 4, 2, 3, [([10], [0.5]), ([], [])])
    fresh = random_seeds(0, 4, 2, 3)
    assert 10 in chosen.seeds[0].tolist() and chosen.seeds.shape == (2, 3)
    assert set(chosen.seeds[1].tolist()) == set(fresh[1].tolist())


def test_the_audit_replays_the_plans_steps_and_picks_stale_candidates():
    plan = Plan(4, 8, 3, 2, None, None, None, "fixed")
    assert audit_steps(plan) == 3 and audit_steps(None) is None
    stale = [([10, 11, 12, 13], [0.1, 0.2, 0.3, 0.4]), ([20, 21, 22, 23], [0.4, 0.3, 0.2, 0.1])]
    picks = audit_candidates(0, 4, stale, audit_prompts=2, audit_candidates_per_prompt=3)
    assert len(picks) == 2 and all(len(seeds) == 3 for _, seeds in picks)
    for p, seeds in picks:
        assert set(seeds.tolist()) <= set(stale[p][0])


def test_audit_tau_compares_each_prompts_stale_and_fresh_ranking():
    stale = [([10, 11, 12], [0.1, 0.2, 0.3]), ([20, 21, 22], [0.3, 0.2, 0.1])]
    same = audit_tau(stale, [Scored(0, 0, np.array([12, 10, 11]), np.array([0.9, 0.1, 0.5])),
                             Scored(1, 0, np.array([20, 22]), np.array([0.8, 0.0]))])
    assert same.stale == [[0.3, 0.1, 0.2], [0.3, 0.1]] and same.kendall_tau == pytest.approx(1.0)
    reversed_ = audit_tau(stale, [Scored(0, 0, np.array([10, 11, 12]),
                                         np.array([0.3, 0.2, 0.1]))])
    assert reversed_.kendall_tau == pytest.approx(-1.0)
    tied = audit_tau(stale, [Scored(0, 0, np.array([10, 11]), np.array([0.5, 0.5]))])
    assert tied.kendall_tau is None


def test_a_selection_survives_its_stored_record_exactly():
    """What a resumed run reads back (iter-k/selection/selection.json) is what was chosen:
    seeds as integers, counts per prompt, and filled seeds' rewards as missing, not zero."""
    import json

    from spotlight.exploration.selection import Selection

    chosen = selection_of("explore", 0, 4, 2, 3, [([10, 11, 12, 13], [0.5, 0.9, 0.1, 0.6]),
                                                  ([7], [0.25])])
    record = json.loads(json.dumps(chosen.to_record()))
    assert record["selected_rewards"][1][1:] == [None, None]
    back = Selection.from_record(record)
    assert back.seeds.dtype == np.int64 and np.array_equal(back.seeds, chosen.seeds)
    assert back.explored.tolist() == [4, 1] and back.filled.tolist() == [0, 2]
    np.testing.assert_array_equal(back.selected_rewards, chosen.selected_rewards)   # nan == nan
    plain = selection_of("random", 0, 4, 2, 2, None)
    assert plain.explored.tolist() == plain.filled.tolist() == [0, 0]
    assert plain.explored.dtype.kind == plain.filled.dtype.kind == "i"
