"""The membership state machine of persistent executors and their SP groups (no processes)."""
from __future__ import annotations

import pytest

from spotlight.parallel.membership import (
    CopyWeights,
    DissolveGroup,
    ExecutorJoined,
    ExecutorLost,
    FormGroup,
    Membership,
    WeightsLoaded,
    WeightsPublished,
    WeightsTrained,
    pack,
)


def node_of_eight(degrees=(4, 2, 1)) -> Membership:
    m = Membership(degrees=degrees)
    for i in range(8):
        m.handle(ExecutorJoined(f"a{i}", "node-a", version=0))
    return m


def members(m: Membership) -> list[tuple[str, ...]]:
    return sorted(g.members for g in m.serving())


def test_pack_takes_the_largest_degrees_first():
    assert pack(list("abcde"), (4, 2, 1)) == [tuple("abcd"), ("e",)]
    assert pack(list("abcdefg"), (4, 2)) == [tuple("abcd"), ("e", "f")]
    assert pack(list("abc"), (4,)) == []


def test_a_full_node_serves_as_two_groups_of_four():
    assert members(node_of_eight()) == [tuple(f"a{i}" for i in range(4)),
                                       tuple(f"a{i}" for i in range(4, 8))]


def test_a_preemption_breaks_only_the_group_it_hits_and_packs_the_survivors():
    m = node_of_eight()
    intact = m.group_of("a0")
    actions = []
    for lost in ("a5", "a6", "a7"):
        actions += m.handle(ExecutorLost(lost))
    dissolved = [a for a in actions if isinstance(a, DissolveGroup)]
    assert dissolved[0].group.members == ("a4", "a5", "a6", "a7")
    assert dissolved[0].reason == "lost a5"   # broken at the first loss
    assert all("a0" not in a.group.members for a in dissolved)
    assert m.group_of("a0") == intact            # untouched: same communicator, same epoch
    assert members(m) == [("a0", "a1", "a2", "a3"), ("a4",)]   # 5 of 8: a 4 and a 1
    formed = [a.group for a in actions if isinstance(a, FormGroup)]
    assert all(g.epoch > intact.epoch for g in formed)


def test_a_newcomer_copies_from_a_peer_on_its_node_then_elsewhere_then_the_store():
    m = node_of_eight()
    m.handle(ExecutorLost("a7"))
    assert m.handle(ExecutorJoined("a8", "node-a")) == [
        CopyWeights("a8", 0, "a0", "shared-memory")]
    assert m.handle(ExecutorJoined("b0", "node-b")) == [CopyWeights("b0", 0, "a0", "network")]
    alone = Membership(degrees=(1,))
    assert alone.handle(ExecutorJoined("c0", "node-c")) == [CopyWeights("c0", 0, None, "store")]


def test_a_loaded_newcomer_joins_a_group_only_the_changed_group_is_reformed():
    m = node_of_eight()
    for lost in ("a5", "a6", "a7"):
        m.handle(ExecutorLost(lost))
    m.handle(ExecutorJoined("a8", "node-a"))
    actions = m.handle(WeightsLoaded("a8", 0))
    assert [(type(a).__name__, a.group.members) for a in actions] == [
        ("DissolveGroup", ("a4",)), ("FormGroup", ("a4", "a8"))]
    assert members(m) == [("a0", "a1", "a2", "a3"), ("a4", "a8")]


def test_new_weights_keep_the_groups_and_load_once_per_node_from_the_store():
    m = node_of_eight()
    groups = set(m.groups)
    actions = m.handle(WeightsPublished(1))
    assert actions[0] == CopyWeights("a0", 1, None, "store")
    assert all(a == CopyWeights(a.executor, 1, "a0", "shared-memory") for a in actions[1:])
    assert m.serving() == []   # nobody holds version 1 yet
    follow = [x for i in range(8) for x in m.handle(WeightsLoaded(f"a{i}", 1))]
    assert follow == [] and set(m.groups) == groups and len(m.serving()) == 2


def test_a_copy_of_an_older_version_that_finishes_late_waits_for_the_current_one():
    m = Membership(degrees=(1,))
    m.handle(ExecutorJoined("a0", "node-a", version=0))
    m.handle(ExecutorJoined("a1", "node-a"))
    m.handle(WeightsPublished(1))
    # The copy of version 1 the publication issued is still to come: no second one.
    assert m.handle(WeightsLoaded("a1", 0)) == []
    assert m.copies["a1"] == CopyWeights("a1", 1, "a0", "shared-memory")


def test_an_older_copy_landing_over_the_current_weights_takes_the_executor_out_and_copies_again():
    m = Membership(degrees=(2, 1))
    for name in ("a0", "a1"):
        m.handle(ExecutorJoined(name, "node-a", version=0))
    pair = m.group_of("a0")
    actions = m.handle(WeightsLoaded("a1", -1))   # a stale copy overwrote what a1 held
    assert actions == [DissolveGroup(pair, "a1 holds version -1"),
                       FormGroup(m.group_of("a0")), CopyWeights("a1", 0, "a0", "shared-memory")]
    assert members(m) == [("a0",)]


def test_bad_events_are_named():
    m = node_of_eight()
    with pytest.raises(ValueError, match="executor 'a0' joined twice"):
        m.handle(ExecutorJoined("a0", "node-a", version=0))
    with pytest.raises(ValueError, match="versions only grow"):
        m.handle(WeightsPublished(0))
    with pytest.raises(ValueError, match="SP degrees >= 1"):
        Membership(degrees=(0,))
    assert m.handle(ExecutorLost("nobody")) == []


def test_a_trained_version_is_copied_from_the_trainers_to_the_rest():
    m = node_of_eight((4,))
    trainers = m.group_of("a0")
    actions = m.handle(WeightsTrained(1, trainers.members))
    assert actions == [CopyWeights(f"a{i}", 1, "a0", "shared-memory") for i in range(4, 8)]
    assert [g.members for g in m.serving()] == [trainers.members]   # the others copy first
    for i in range(4, 8):
        assert m.handle(WeightsLoaded(f"a{i}", 1)) == []
    assert len(m.serving()) == 2
    with pytest.raises(ValueError, match="none of its holders"):
        m.handle(WeightsTrained(2, ("nobody",)))


def test_copies_still_wanted_after_their_source_is_lost_come_from_another_peer():
    m = node_of_eight((4,))
    m.handle(ExecutorLost("a7"))
    assert m.handle(ExecutorJoined("a8", "node-a")) == [
        CopyWeights("a8", 0, "a0", "shared-memory")]
    m.handle(ExecutorLost("a0"))   # the source went before the copy finished
    assert m.pending_copies() == [CopyWeights("a8", 0, "a1", "shared-memory")]
