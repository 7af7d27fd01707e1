"""Which persistent executors form which sequence-parallel groups, as a state machine.

An executor is a long-lived process on one device (a Dask worker process) that keeps the
policy's weights between requests. A group is a set of executors on **one node** with its own
communicator; it serves requests of its degree. When a spot preemption takes executors away,
the groups they were in break; the survivors keep their weights, so re-forming groups costs a
new communicator, not a reload. A newcomer gets the weights from a peer: over shared memory
from a live executor on its node, over the network from another node only when no local peer
holds them, from the run store only when nobody does.

Events in, actions out (:meth:`Membership.handle`); no processes, no clocks. After every
change of a node, its ready executors are packed into the largest groups the allowed degrees
give (:func:`pack`: 5 of 8 with degrees 4, 2, 1 -> a group of 4 and one of 1, the latter
serving the smaller requests); groups whose members did not change keep serving, the others
are dissolved and formed anew under a new epoch (the communicator's generation, so a late
message from a broken group is recognised).

The invariant the glue relies on, under any interleaving of events (a randomized test drives
thousands of event sequences against it, ``tests/parallel/test_membership_invariant.py``):

1. A group is **formed** only of executors that hold its version: every :class:`FormGroup`
   names members that are ready at the membership's current version. A standing group may
   keep a member that is loading a newer version (its communicator stays; it serves again
   once all its members hold the version, :meth:`Membership.serving`), but no new group is
   formed around such a member.
2. Every live executor without the current version has exactly one copy of it outstanding,
   from a source that is alive: a copy whose source is lost or that failed is re-issued, and a
   version published or trained while copies of an older one are under way replaces them.
3. Once every outstanding copy has finished, each node's groups are the packing of all its
   executors (:func:`pack`) and all of them serve.

Where the processes disagree with this view (a worker restarted at the same address, a copy
that failed silently), the glue reports :class:`WeightsNotHeld` and the executor copies again
before any group is formed with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ExecutorState(Enum):
    LOADING = "loading"     # joined, receiving the weights
    READY = "ready"         # holds the current weights
    GONE = "gone"


@dataclass
class Executor:
    name: str
    node: str
    state: ExecutorState = ExecutorState.LOADING
    version: int | None = None     # weights version it holds
    group: str | None = None


@dataclass(frozen=True)
class Group:
    name: str
    node: str
    members: tuple[str, ...]     # in rank order
    epoch: int

    @property
    def degree(self) -> int:
        return len(self.members)


# --- events ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExecutorJoined:
    executor: str
    node: str
    version: int | None = None   # weights it already holds (None: none)


@dataclass(frozen=True)
class ExecutorLost:
    executor: str


@dataclass(frozen=True)
class WeightsLoaded:
    executor: str
    version: int


@dataclass(frozen=True)
class CopyFailed:
    """A copy to ``executor`` raised (its source and target both still alive): it is issued
    again, from another source where there is one."""
    executor: str
    version: int


@dataclass(frozen=True)
class WeightsNotHeld:
    """The process of ``executor`` was found holding ``holds`` (None: nothing), not what this
    membership believed -- it was restarted at the same address, or a copy failed silently."""
    executor: str
    holds: int | None


@dataclass(frozen=True)
class WeightsTrained:
    """A group trained a new version in place: its members (``holders``) hold it already, the
    other executors copy it from them."""
    version: int
    holders: tuple[str, ...]


@dataclass(frozen=True)
class WeightsPublished:
    """Training committed a new version; executors must hold it before serving again."""
    version: int


# --- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyWeights:
    executor: str
    version: int
    source: str | None    # the executor to copy from (None: the run store)
    via: str              # "shared-memory" (same node), "network" or "store"


@dataclass(frozen=True)
class FormGroup:
    group: Group


@dataclass(frozen=True)
class DissolveGroup:
    group: Group
    reason: str


Event = (ExecutorJoined | ExecutorLost | WeightsLoaded | WeightsPublished | WeightsTrained
         | CopyFailed | WeightsNotHeld)
Action = CopyWeights | FormGroup | DissolveGroup


def pack(executors: list[str], degrees: tuple[int, ...]) -> list[tuple[str, ...]]:
    """``executors`` (in order) split into groups, largest allowed degree first, as many of
    each as fit; what no degree fits stays out."""
    out, rest = [], list(executors)
    for degree in sorted(set(degrees), reverse=True):
        while len(rest) >= degree:
            out.append(tuple(rest[:degree]))
            rest = rest[degree:]
    return out


@dataclass
class Membership:
    """The executors and groups of a cluster. ``degrees``: the SP degrees requests use."""

    degrees: tuple[int, ...] = (1,)
    version: int = 0
    executors: dict[str, Executor] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    epoch: int = 0
    copies: dict[str, CopyWeights] = field(default_factory=dict)   # outstanding, by target

    def __post_init__(self) -> None:
        if not self.degrees or min(self.degrees) < 1:
            raise ValueError(f"Membership degrees {self.degrees}: give SP degrees >= 1")

    def handle(self, event: Event) -> list[Action]:
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise TypeError(f"Membership.handle: {event!r} is not a membership event")
        actions = handler(event)
        for action in actions:
            if isinstance(action, CopyWeights):
                self.copies[action.executor] = action
        return actions

    # -- queries ---------------------------------------------------------------------------
    def serving(self, degree: int | None = None) -> list[Group]:
        """Groups (of ``degree``) whose members all hold the current weights."""
        return [g for g in self.groups.values() if (degree is None or g.degree == degree)
                and all(self._holds_current(self.executors[m]) for m in g.members)]

    def pending_copies(self) -> list[CopyWeights]:
        """A copy for every live executor still without the current weights, from whoever
        holds them now (the glue cancelled the copies under way, e.g. after a loss)."""
        copies = [self._copy_to(e) for e in self._live() if e.state is ExecutorState.LOADING]
        self.copies = {c.executor: c for c in copies}
        return copies

    def group_of(self, executor: str) -> Group | None:
        name = self.executors[executor].group if executor in self.executors else None
        return self.groups.get(name) if name else None

    # -- handlers --------------------------------------------------------------------------
    def _on_ExecutorJoined(self, event: ExecutorJoined) -> list[Action]:
        known = self.executors.get(event.executor)
        if known is not None and known.state is not ExecutorState.GONE:
            raise ValueError(f"executor {event.executor!r} joined twice (it is "
                             f"{known.state.value})")
        executor = Executor(event.executor, event.node, version=event.version)
        self.executors[event.executor] = executor
        if event.version == self.version:
            executor.state = ExecutorState.READY
            return self._regroup(event.node)
        return [self._copy_to(executor)]

    def _on_ExecutorLost(self, event: ExecutorLost) -> list[Action]:
        executor = self.executors.get(event.executor)
        if executor is None or executor.state is ExecutorState.GONE:
            return []
        executor.state = ExecutorState.GONE
        self.copies.pop(executor.name, None)
        actions = self._regroup(executor.node)
        # Copies that were to come from it come from whoever holds the version now.
        return actions + [self._copy_to(self.executors[c.executor])
                          for c in list(self.copies.values()) if c.source == executor.name]

    def _on_WeightsLoaded(self, event: WeightsLoaded) -> list[Action]:
        executor = self.executors.get(event.executor)
        if executor is None or executor.state is ExecutorState.GONE:
            return []
        if event.version != self.version:   # a copy of an older version finished late
            if executor.state is ExecutorState.READY:   # ... over the current one
                return self._on_WeightsNotHeld(WeightsNotHeld(executor.name, event.version))
            executor.version = event.version
            wanted = self.copies.get(executor.name)
            return [] if wanted is not None and wanted.version == self.version \
                else [self._copy_to(executor)]
        executor.version = event.version
        self.copies.pop(executor.name, None)
        executor.state = ExecutorState.READY
        return self._regroup(executor.node)

    def _on_CopyFailed(self, event: CopyFailed) -> list[Action]:
        executor = self.executors.get(event.executor)
        if executor is None or executor.state is not ExecutorState.LOADING \
                or event.version != self.version:
            return []   # gone, or a copy nobody wants any more
        failed = self.copies.get(executor.name)
        return [self._copy_to(executor, avoid=failed.source if failed else None)]

    def _on_WeightsNotHeld(self, event: WeightsNotHeld) -> list[Action]:
        executor = self.executors.get(event.executor)
        if executor is None or executor.state is ExecutorState.GONE:
            return []
        executor.version = event.holds
        if event.holds == self.version:
            return []
        executor.state = ExecutorState.LOADING
        actions: list[Action] = []
        group = self.group_of(executor.name)
        if group is not None:   # it cannot serve in its group until it holds the weights
            actions += self._dissolve(group, f"{executor.name} holds version {event.holds}")
            actions += self._regroup(executor.node)
        # A copy under way to it, from a peer that believes it holds the version, may be
        # as wrong as this one: copy again, from a peer that is ready.
        return actions + [self._copy_to(executor)]

    def _on_WeightsPublished(self, event: WeightsPublished) -> list[Action]:
        """Every live executor loads the new version: on each node the first reads the store
        and the others copy from it over shared memory (the glue starts a copy once its source
        holds the version). Groups keep their communicators -- nobody left -- and serve again
        once all their members hold it (:meth:`serving`)."""
        if event.version <= self.version:
            raise ValueError(f"weights version {event.version} published after {self.version}; "
                             "versions only grow")
        self.version = event.version
        self.copies = {}
        actions: list[Action] = []
        first: dict[str, str] = {}
        for executor in self._live():
            executor.state = ExecutorState.LOADING
            source = first.setdefault(executor.node, executor.name)
            actions.append(CopyWeights(executor.name, self.version, None, "store")
                           if source == executor.name else
                           CopyWeights(executor.name, self.version, source, "shared-memory"))
        return actions

    def _on_WeightsTrained(self, event: WeightsTrained) -> list[Action]:
        if event.version <= self.version:
            raise ValueError(f"weights version {event.version} trained after {self.version}; "
                             "versions only grow")
        holders = [self.executors[h] for h in event.holders if h in self.executors
                   and self.executors[h].state is not ExecutorState.GONE]
        if not holders:
            raise ValueError(f"weights version {event.version}: none of its holders "
                             f"{list(event.holders)} is a live executor")
        self.version = event.version
        self.copies = {}
        for holder in holders:
            holder.version, holder.state = event.version, ExecutorState.READY
        others = [e for e in self._live() if e not in holders]
        for executor in others:
            executor.state = ExecutorState.LOADING
        return [self._copy_to(e) for e in others]

    # -- helpers ---------------------------------------------------------------------------
    def _live(self) -> list[Executor]:
        return [e for e in self.executors.values() if e.state is not ExecutorState.GONE]

    def _holds_current(self, executor: Executor) -> bool:
        return executor.state is ExecutorState.READY and executor.version == self.version

    def _copy_to(self, executor: Executor, avoid: str | None = None) -> CopyWeights:
        """From a ready peer on the same node, else on another node, else the store
        (``avoid``: a source whose copy just failed -- never the same peer twice in a row;
        the store is the source of last resort)."""
        peers = [e for e in self.executors.values() if self._holds_current(e)
                 and e.name not in (executor.name, avoid)]
        local = [e for e in peers if e.node == executor.node]
        if local:
            return CopyWeights(executor.name, self.version, local[0].name, "shared-memory")
        if peers:
            return CopyWeights(executor.name, self.version, peers[0].name, "network")
        return CopyWeights(executor.name, self.version, None, "store")

    def _dissolve(self, group: Group, reason: str) -> list[Action]:
        del self.groups[group.name]
        for member in group.members:
            if self.executors[member].group == group.name:
                self.executors[member].group = None
        return [DissolveGroup(group, reason)]

    def _regroup(self, node: str) -> list[Action]:
        """Pack the node's ready executors anew, keep the groups that come out unchanged and
        form the others -- of ready executors only (invariant 1). An intact group (nobody
        lost) with a member still loading a new version stands as it is until that member
        holds it."""
        intact = {g.name: g for g in self.groups.values() if g.node == node and all(
            self.executors[m].state is not ExecutorState.GONE for m in g.members)}
        waiting = [g for g in intact.values() if not all(
            self.executors[m].state is ExecutorState.READY for m in g.members)]
        held = {m for g in waiting for m in g.members}
        order = {name: i for i, name in enumerate(self.executors)}

        def place(name: str) -> tuple:
            # Members of intact groups first, larger groups first, in rank order; then the
            # rest in join order -- so packing leaves an intact group as it is.
            group = intact.get(self.executors[name].group or "")
            if group is None:
                return (1, 0, 0, order[name])
            return (0, -group.degree, group.epoch, group.members.index(name))

        ready = sorted((e.name for e in self.executors.values() if e.node == node
                        and e.state is ExecutorState.READY and e.name not in held), key=place)
        wanted = [g.members for g in waiting] + pack(ready, self.degrees)
        actions: list[Action] = []
        for group in [g for g in self.groups.values() if g.node == node
                      and g.members not in wanted]:
            gone = [m for m in group.members if self.executors[m].state is ExecutorState.GONE]
            actions += self._dissolve(group, f"lost {', '.join(gone)}" if gone else "regrouped")
        kept = {g.members for g in self.groups.values() if g.node == node}
        for members in wanted:
            if members in kept:
                continue
            self.epoch += 1
            group = Group(f"{node}/g{self.epoch}", node, members, self.epoch)
            self.groups[group.name] = group
            for member in members:
                self.executors[member].group = group.name
            actions.append(FormGroup(group))
        return actions
