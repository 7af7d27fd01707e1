"""The driver's side of elastic SP: carry out the membership state machine's actions on Dask
workers that are persistent executors (:mod:`pipelines.parallel.executor`).

:class:`SPGroups` turns workers joining and leaving into :mod:`spotlight.parallel.membership`
events, and its actions into tasks pinned to the workers: weight copies (run store, a peer's
shared memory, a peer over the network), group formation (a rendezvous on the new rank 0, then
every member joins at once), and SP forwards on a formed group. An executor is named by its
worker's address and placed on the node of the worker's host.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from distributed import Client

from pipelines.parallel import executor
from spotlight.parallel.membership import (CopyWeights, DissolveGroup, ExecutorJoined,
                                           ExecutorLost, FormGroup, Group, Membership,
                                           WeightsLoaded, WeightsPublished, WeightsTrained)


POLL_S = 0.01   # how often a wait checks that its workers are still there
# A member's death reaches its peers' collectives (an error) before the scheduler: how long a
# failed task waits for one of its group to be reported gone before its error counts as a bug.
LOSS_GRACE_S = 5.0


def _addresses(dask_scheduler) -> list[str]:
    return sorted(dask_scheduler.workers)


def live_workers(client: Client) -> list[str]:
    """The workers the scheduler knows now (asked directly: ``client.scheduler_info()`` may
    hand back a periodically refreshed copy without per-worker entries)."""
    return client.run_on_scheduler(_addresses)


def kill_executors(client: Client, addresses: list[str]) -> float:
    """SIGKILL the worker processes at ``addresses`` (a preemption without notice); returns
    when, by ``time.perf_counter``."""
    import os
    import signal

    pids = client.run(os.getpid, workers=list(addresses))
    killed = time.perf_counter()
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    return killed


def node_of(address: str) -> str:
    """A worker's node: the host of its address."""
    return address.split("://")[-1].rsplit(":", 1)[0]


@dataclass
class SPGroups:
    """Executors on ``client``'s workers, grouped by ``degrees``, serving ``version`` of the
    model ``spec`` whose checkpoint lies in the run store at ``url``. ``node`` says where an
    executor is: groups never span two nodes (by default a worker's host; the pipeline adds
    the worker class, so a group is of one class)."""

    client: Client
    spec: dict
    url: str
    version: int
    degrees: tuple[int, ...]
    node: Callable[[str], str] = node_of
    membership: Membership = field(init=False)
    log: list[dict] = field(default_factory=list)   # what each action took
    losses: int = 0   # executors lost so far (reported, or found gone while acting)

    def __post_init__(self) -> None:
        from spotlight.parallel.ulysses import check_degree

        if "config" in self.spec:   # a run's config was checked when it was read
            heads = self.spec["config"].get("num_attention_heads")
            for degree in self.degrees:   # an impossible degree fails here, not in a collective
                check_degree(degree, heads=heads)
        self.membership = Membership(degrees=self.degrees, version=self.version)

    # -- membership changes ----------------------------------------------------------------
    def add(self, addresses: list[str]) -> list[Group]:
        """Workers join as executors (holding nothing); returns the groups formed."""
        actions = [a for address in addresses
                   for a in self.membership.handle(ExecutorJoined(address, self.node(address)))]
        return self._carry_out(actions)

    def lost(self, address: str) -> list[Group]:
        """A worker is gone; the survivors regroup. Returns the groups formed."""
        self.losses += 1
        return self._carry_out(self.membership.handle(ExecutorLost(address)))

    def published(self, version: int) -> list[Group]:
        """Training committed ``version`` to the run store: every executor takes it (one per
        node from the store, its peers from that one's shared memory)."""
        self.version = version
        return self._carry_out(self.membership.handle(WeightsPublished(version)))

    def trained(self, version: int, group: Group) -> None:
        """``group`` trained ``version`` in place; every other executor copies it from them."""
        self.version = version
        self._carry_out(self.membership.handle(WeightsTrained(version, group.members)))

    def forward(self, group: Group, inputs: dict):
        """One SP forward of ``inputs`` on ``group``: the whole output."""
        return self.submit(group, executor.forward, inputs)[0].result()

    def submit(self, group: Group, fn, *args):
        """``fn(group.epoch, *args)`` on every member of ``group`` at once (an SP request);
        the futures in rank order -- rank 0's holds the result."""
        return [self.client.submit(fn, group.epoch, *args, workers=[m], pure=False,
                                   allow_other_workers=False) for m in group.members]

    # -- actions -----------------------------------------------------------------------------
    def _carry_out(self, actions: list) -> list[Group]:
        """Carry ``actions`` out, and the actions they lead to. An executor lost meanwhile
        (a task pinned to it would wait for ever) is a loss like any other: the groups regroup
        and the copies still wanted are issued again."""
        formed: list[Group] = []
        while actions:
            try:
                formed += self._step(actions)
                actions = []
            except ExecutorGone as gone:
                self.log.append({"action": "lost-meanwhile", "executor": gone.address})
                self.losses += 1
                actions = self.membership.handle(ExecutorLost(gone.address)) \
                    + self.membership.pending_copies()
        return [g for g in formed if g.name in self.membership.groups]

    def _step(self, actions: list) -> list[Group]:
        formed: list[Group] = []
        while actions:
            copies = [a for a in actions if isinstance(a, CopyWeights)]
            # Events handled together may form a group and dissolve it again: form only
            # the groups that stand.
            forms = [a.group for a in actions if isinstance(a, FormGroup)
                     and a.group.name in self.membership.groups]
            for action in actions:
                if isinstance(action, DissolveGroup):
                    self.log.append({"action": "dissolve", "group": action.group.name,
                                     "reason": action.reason})
            formed += self._form(forms)
            # A copy from a peer that is itself still receiving the version waits a round.
            targets = {c.executor for c in copies}
            later = [c for c in copies if c.source in targets]
            actions = [a for done in self._copy([c for c in copies if c not in later])
                       for a in self.membership.handle(done)] + later
        return formed

    def _await(self, futures: list, pinned: set[str]) -> list:
        return await_pinned(self.client, futures, pinned)

    def _copy(self, copies: list[CopyWeights]) -> list[WeightsLoaded]:
        """Every copy at once; the events of the finished ones."""
        futures, pinned = [], set()
        for copy in copies:
            target = dict(workers=[copy.executor], pure=False, allow_other_workers=False)
            pinned |= {copy.executor} | ({copy.source} if copy.source else set())
            if copy.via == "store":
                future = self.client.submit(executor.load_from_store, self.spec, self.url,
                                            copy.version, **target)
            elif copy.via == "shared-memory":
                path = self.client.submit(executor.share_weights, self.spec, copy.version,
                                          workers=[copy.source], pure=False,
                                          allow_other_workers=False)
                future = self.client.submit(executor.load_shared, self.spec, path, copy.version,
                                            **target)
            else:
                weights = self.client.submit(executor.export_weights, self.spec, copy.version,
                                             workers=[copy.source], pure=False,
                                             allow_other_workers=False)
                future = self.client.submit(executor.load_weights, self.spec, weights,
                                            copy.version, **target)
            futures.append(future)
        started = time.perf_counter()
        results = self._await(futures, pinned)
        for copy, result in zip(copies, results):
            self.log.append({"action": "copy", "executor": copy.executor, "via": copy.via,
                             "s": time.perf_counter() - started, **result})
        return [WeightsLoaded(copy.executor, copy.version) for copy in copies]

    def _form(self, groups: list[Group]) -> list[Group]:
        """A rendezvous on each group's rank 0, then all members of all groups join at once."""
        if not groups:
            return []
        started = time.perf_counter()
        members = {m for g in groups for m in g.members}
        rendezvous = [self.client.submit(executor.open_rendezvous, workers=[g.members[0]],
                                         pure=False, allow_other_workers=False) for g in groups]
        joins = []
        for group, place in zip(groups, self._await(rendezvous, members)):
            joins += [self.client.submit(executor.join, group.epoch, rank, group.degree, *place,
                                         self.version, workers=[member], pure=False,
                                         allow_other_workers=False)
                      for rank, member in enumerate(group.members)]
        results = self._await(joins, members)
        self.log.append({"action": "form", "groups": [g.members for g in groups],
                         "s": time.perf_counter() - started,
                         "communicator_s": max(r["communicator_s"] for r in results)})
        return groups


def await_pinned(client: Client, futures: list, pinned: set[str]) -> list:
    """The results of ``futures`` pinned to the ``pinned`` workers; :class:`ExecutorGone` as
    soon as one of those workers has left the cluster (a task pinned to it would wait for
    ever)."""
    while not all(f.done() for f in futures):
        if any(f.status == "error" for f in futures):
            break   # a member's collective failed: was a peer lost?
        _check_pinned(client, futures, pinned)
        time.sleep(POLL_S)
    if any(f.status == "error" for f in futures):
        deadline = time.monotonic() + LOSS_GRACE_S
        while time.monotonic() < deadline:
            _check_pinned(client, futures, pinned)
            time.sleep(POLL_S)
    return [f.result() for f in futures]   # an error with nobody lost is the task's own


def _check_pinned(client: Client, futures: list, pinned: set[str]) -> None:
    gone = sorted(pinned - set(live_workers(client)))
    if gone:
        client.cancel(futures)
        raise ExecutorGone(gone[0])


class ExecutorGone(RuntimeError):
    """A worker that tasks were pinned to left the cluster."""

    def __init__(self, address: str) -> None:
        super().__init__(f"executor {address} left the cluster")
        self.address = address
