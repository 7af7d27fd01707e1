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


Event = ExecutorJoined | ExecutorLost | WeightsLoaded | WeightsPublished | WeightsTrained
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

    def __post_init__(self) -> None:
        if not self.degrees or min(self.degrees) < 1:
            raise ValueError(f"Membership degrees {self.degrees}: give SP degrees >= 1")

    def handle(self, event: Event) -> list[Action]:
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise TypeError(f"Membership.handle: {event!r} is not a membership event")
        return handler(event)

    # -- queries ---------------------------------------------------------------------------
    def serving(self, degree: int | None = None) -> list[Group]:
        """Groups (of ``degree``) whose members all hold the current weights."""
        return [g for g in self.groups.values() if (degree is None or g.degree == degree)
                and all(self.executors[m].state is ExecutorState.READY for m in g.members)]

    def pending_copies(self) -> list[CopyWeights]:
        """A copy for every live executor still without the current weights, from whoever
        holds them now (after a loss took a copy's source away)."""
        return [self._copy_to(e) for e in self._live() if e.state is ExecutorState.LOADING]

    def group_of(self, executor: str) -> Group | None:
        name = self.executors[executor].group if executor in self.executors else None
        return self.groups.get(name) if name else None

    # -- handlers --------------------------------------------------------------------------
    def _on_ExecutorJoined(self, event: ExecutorJoined) -> list[Action]:
        known = self.executors.get(event.executor)
        if known is not None and known.state is not ExecutorState.GONE:
            raise ValueError(f"executor {event.executor!r} joined twice (it is {known.state.value})")
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
        return self._regroup(executor.node)

    def _on_WeightsLoaded(self, event: WeightsLoaded) -> list[Action]:
        executor = self.executors.get(event.executor)
        if executor is None or executor.state is ExecutorState.GONE:
            return []
        executor.version = event.version
        if event.version != self.version:   # an older copy finished late: copy again
            return [self._copy_to(executor)]
        executor.state = ExecutorState.READY
        if executor.group is not None:   # a new version in a standing group: nothing to form
            return []
        return self._regroup(executor.node)

    def _on_WeightsPublished(self, event: WeightsPublished) -> list[Action]:
        """Every live executor loads the new version: on each node the first reads the store
        and the others copy from it over shared memory (the glue starts a copy once its source
        holds the version). Groups keep their communicators -- nobody left -- and serve again
        once all their members hold it (:meth:`serving`)."""
        if event.version <= self.version:
            raise ValueError(f"weights version {event.version} published after {self.version}; "
                             "versions only grow")
        self.version = event.version
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
        for holder in holders:
            holder.version, holder.state = event.version, ExecutorState.READY
        others = [e for e in self._live() if e not in holders]
        for executor in others:
            executor.state = ExecutorState.LOADING
        return [self._copy_to(e) for e in others]

    # -- helpers ---------------------------------------------------------------------------
    def _live(self) -> list[Executor]:
        return [e for e in self.executors.values() if e.state is not ExecutorState.GONE]

    def _copy_to(self, executor: Executor) -> CopyWeights:
        """From a ready peer on the same node, else on another node, else the store."""
        peers = [e for e in self.executors.values() if e.state is ExecutorState.READY
                 and e.version == self.version and e.name != executor.name]
        local = [e for e in peers if e.node == executor.node]
        if local:
            return CopyWeights(executor.name, self.version, local[0].name, "shared-memory")
        if peers:
            return CopyWeights(executor.name, self.version, peers[0].name, "network")
        return CopyWeights(executor.name, self.version, None, "store")

    def _regroup(self, node: str) -> list[Action]:
        """Pack the node's live grouped or ready executors anew; keep the groups that come out
        unchanged (a member still loading a new version stays in its group)."""
        ready = [e.name for e in self.executors.values() if e.node == node and (
            e.state is ExecutorState.READY
            or (e.state is ExecutorState.LOADING and e.group is not None))]
        # Members of intact groups (nobody lost) first, larger groups first, in rank order;
        # then the rest in join order -- so packing leaves an intact group as it is.
        intact = {g.name: g for g in self.groups.values() if g.node == node and all(
            self.executors[m].state is not ExecutorState.GONE for m in g.members)}
        order = {name: i for i, name in enumerate(self.executors)}

        def place(name: str) -> tuple:
            group = intact.get(self.executors[name].group or "")
            if group is None:
                return (1, 0, 0, order[name])
            return (0, -group.degree, group.epoch, group.members.index(name))

        ready.sort(key=place)
        wanted = pack(ready, self.degrees)
        kept = {g.name: g for g in self.groups.values()
                if g.node == node and g.members in wanted}
        actions: list[Action] = []
        for group in [g for g in self.groups.values() if g.node == node and g.name not in kept]:
            del self.groups[group.name]
            for member in group.members:
                if self.executors[member].group == group.name:
                    self.executors[member].group = None
            gone = [m for m in group.members if self.executors[m].state is ExecutorState.GONE]
            actions.append(DissolveGroup(group, f"lost {', '.join(gone)}" if gone
                                         else "regrouped"))
        for members in wanted:
            if any(g.members == members for g in kept.values()):
                continue
            self.epoch += 1
            group = Group(f"{node}/g{self.epoch}", node, members, self.epoch)
            self.groups[group.name] = group
            for member in members:
                self.executors[member].group = group.name
            actions.append(FormGroup(group))
        return actions
