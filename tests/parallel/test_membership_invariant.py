"""The membership state machine against its invariant under randomized event sequences.

A small world stands in for the processes: which version each executor's process really holds,
which copies are under way, which processes are alive. Hypothesis drives it with kills, joins,
copies finishing or failing, versions published or trained in place and processes that lose
their weights silently (a restart at the same address), and carries every action out the way
:class:`pipelines.parallel.groups.SPGroups` does -- a group is formed only after each member's
process was asked what it holds. After every step the invariant of
:mod:`spotlight.parallel.membership` must hold; at the end, once the copies are allowed to
finish, every node must be packed into serving groups.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spotlight.parallel.membership import (
    CopyFailed,
    CopyWeights,
    ExecutorJoined,
    ExecutorLost,
    ExecutorState,
    FormGroup,
    Membership,
    WeightsLoaded,
    WeightsNotHeld,
    WeightsPublished,
    WeightsTrained,
    pack,
)

NODES = ("n0", "n1")
# Event sequences per run of the test; `make mutation` runs it once per mutant and sets fewer.
SEQUENCES = int(os.environ.get("SPOTLIGHT_INVARIANT_SEQUENCES", "2000"))
STEPS = 40                # events per sequence, at most
READY, LOADING = ExecutorState.READY, ExecutorState.LOADING


class MembershipWorld(RuleBasedStateMachine):
    """The membership, and the processes it describes."""

    @initialize(degrees=st.sampled_from([(4, 2, 1), (2, 1), (2,), (4, 2), (1,)]),
                start=st.lists(st.sampled_from(NODES), min_size=0, max_size=6))
    def start(self, degrees, start):
        self.m = Membership(degrees=degrees)
        self.holds: dict[str, int | None] = {}     # what each live process really holds
        self.copies: list[CopyWeights] = []        # under way in the processes
        self.named = 0
        self.formed = 0
        for node in start:
            self._join(node, version=0)

    # -- carrying actions out, as the glue does ------------------------------------------------
    def _apply(self, actions: list) -> None:
        # Invariant 1, when the state machine emits them: a group is formed only of executors
        # ready at its version.
        for group in [a.group for a in actions if isinstance(a, FormGroup)]:
            for member in group.members:
                executor = self.m.executors[member]
                assert executor.state is READY and executor.version == self.m.version, \
                    f"{group} formed with {member} {executor.state.value} at " \
                    f"{executor.version}, serving {self.m.version}"
        for action in actions:
            if isinstance(action, CopyWeights):
                assert action.source is None or action.source in self.holds, \
                    f"{action} copies from an executor that is gone"
                self.copies.append(action)
            elif isinstance(action, FormGroup):
                self._form(action.group)

    def _form(self, group) -> None:
        """What the glue does with a FormGroup: only a group that still stands and serves (an
        action carried out before may have changed that) is formed, and only after each
        member's process was asked what it holds."""
        if group not in self.m.serving():
            return
        for member in group.members:
            if self.holds[member] != self.m.version:
                self._apply(self.m.handle(WeightsNotHeld(member, self.holds[member])))
                return
        self.formed += 1

    def _join(self, node: str, version: int | None) -> None:
        name = f"e{self.named}"
        self.named += 1
        self.holds[name] = version
        self._apply(self.m.handle(ExecutorJoined(name, node, version=version)))

    def _finishable(self) -> list[CopyWeights]:
        """Copies whose source holds the version now (or the store): the others wait."""
        return [c for c in self.copies if c.source is None or self.holds.get(c.source) == c.version]

    def _finish(self, copy: CopyWeights) -> None:
        self.copies.remove(copy)
        self.holds[copy.executor] = copy.version
        self._apply(self.m.handle(WeightsLoaded(copy.executor, copy.version)))

    def _fail(self, copy: CopyWeights) -> None:
        """A copy raised. If its source was asked for a version it does not hold, the source's
        check says so (the glue reports what it holds), then the copy is issued again."""
        self.copies.remove(copy)
        source = copy.source
        if source is not None and self.holds[source] != copy.version and not any(
                c.executor == source and c.version == copy.version for c in self.copies):
            self._apply(self.m.handle(WeightsNotHeld(source, self.holds[source])))
        self._apply(self.m.handle(CopyFailed(copy.executor, copy.version)))

    # -- events ----------------------------------------------------------------------------------
    @rule(node=st.sampled_from(NODES), holding=st.booleans())
    def join(self, node, holding):
        self._join(node, self.m.version if holding else None)

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def kill(self, data):
        victim = data.draw(st.sampled_from(sorted(self.holds)))
        del self.holds[victim]
        # Copies to it die with it; copies from it are cancelled (their tasks were pinned to it).
        self.copies = [c for c in self.copies if victim not in (c.executor, c.source)]
        self._apply(self.m.handle(ExecutorLost(victim)))

    @precondition(lambda self: self._finishable())
    @rule(data=st.data())
    def copy_finishes(self, data):
        self._finish(data.draw(st.sampled_from(self._finishable())))

    @precondition(lambda self: self.copies)
    @rule(data=st.data())
    def copy_fails(self, data):
        self._fail(data.draw(st.sampled_from(self.copies)))

    @rule()
    def publish(self):
        self._apply(self.m.handle(WeightsPublished(self.m.version + 1)))

    @precondition(lambda self: self.m.serving())
    @rule(data=st.data())
    def train_in_place(self, data):
        group = data.draw(st.sampled_from(sorted(self.m.serving(), key=lambda g: g.name)))
        if any(self.holds[m] != self.m.version for m in group.members):
            return   # a group with a member that silently lost its weights cannot train
        for member in group.members:
            self.holds[member] = self.m.version + 1
        self._apply(self.m.handle(WeightsTrained(self.m.version + 1, group.members)))

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def process_restarts_at_the_same_address(self, data):
        self.holds[data.draw(st.sampled_from(sorted(self.holds)))] = None

    # -- the invariant ---------------------------------------------------------------------------
    @invariant()
    def groups_are_consistent(self):
        seen: set[str] = set()
        for name, group in self.m.groups.items():
            assert group.degree in self.m.degrees, group
            for member in group.members:
                executor = self.m.executors[member]
                assert executor.state is not ExecutorState.GONE, f"{group} keeps {member}"
                assert executor.node == group.node and executor.group == name
                assert member not in seen, f"{member} is in two groups"
                seen.add(member)
        for group in self.m.serving():
            assert all(self.m.executors[m].state is READY for m in group.members)

    @invariant()
    def every_executor_without_the_version_has_one_live_copy_under_way(self):
        for executor in self.m.executors.values():
            if executor.state is READY:
                assert executor.version == self.m.version
            if executor.state is not LOADING:
                continue
            wanted = self.m.copies.get(executor.name)
            assert wanted is not None and wanted.version == self.m.version, \
                f"{executor.name} waits for version {self.m.version} and no copy is wanted"
            assert wanted in self.copies, f"{wanted} was never issued (or was lost)"
            assert wanted.source is None or wanted.source in self.holds, \
                f"{wanted} copies from an executor that is gone"

    def teardown(self):
        """Invariant 3: let the copies finish (a copy from a process that silently lost its
        weights fails, as the executor's check makes it) -- then every node is packed."""
        if not hasattr(self, "m"):
            return
        for _ in range(10_000):
            if not self.copies:
                break
            ready = self._finishable()
            self._finish(ready[0]) if ready else self._fail(self.copies[0])
        assert not self.copies, "the copies never settled"
        assert not [e for e in self.m.executors.values() if e.state is LOADING]
        for node in NODES:
            on_node = [e.name for e in self.m.executors.values()
                       if e.node == node and e.state is READY]
            groups = [g for g in self.m.groups.values() if g.node == node]
            assert Counter(g.degree for g in groups) == \
                Counter(len(g) for g in pack(on_node, self.m.degrees)), (node, groups)
        assert len(self.m.serving()) == len(self.m.groups)


MembershipWorld.TestCase.settings = settings(
    max_examples=SEQUENCES, stateful_step_count=STEPS, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_membership_keeps_its_invariant_under_random_events = MembershipWorld.TestCase


def test_a_loss_while_a_version_is_copied_forms_no_group_around_a_loading_member():
    """The race that ended ``bench preemption``'s SP scenario: a pair and a single on one node,
    a new version being copied; the pair loses a member. Packing the survivor with the single
    (still loading) formed a group whose join refused the version."""
    m = Membership(degrees=(2, 1))
    for name in ("a", "b", "c"):
        m.handle(ExecutorJoined(name, "n0", version=0))
    single = next(g for g in m.groups.values() if g.degree == 1)
    m.handle(WeightsPublished(1))
    assert m.handle(WeightsLoaded("a", 1)) == []
    formed = [a.group for a in m.handle(ExecutorLost("b")) if isinstance(a, FormGroup)]
    assert [g.members for g in formed] == [("a",)]
    assert m.groups[single.name] == single   # stands, and serves once c holds version 1
    formed = [a.group for a in m.handle(WeightsLoaded("c", 1)) if isinstance(a, FormGroup)]
    assert [g.members for g in formed] == [("c", "a")] and m.serving() == formed


@pytest.mark.parametrize("event", [CopyFailed("x", 1), WeightsNotHeld("x", None)])
def test_events_about_unknown_executors_change_nothing(event):
    m = Membership(degrees=(1,))
    assert m.handle(event) == [] and m.executors == {}
