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

from pipelines.cluster import worker_classes
from pipelines.parallel import executor
from spotlight.parallel.membership import (
    CopyFailed,
    CopyWeights,
    DissolveGroup,
    ExecutorJoined,
    ExecutorLost,
    FormGroup,
    Group,
    Membership,
    WeightsLoaded,
    WeightsNotHeld,
    WeightsPublished,
    WeightsTrained,
)
from spotlight.parallel.ulysses import check_degree

POLL_S = 0.01   # how often a wait checks that its workers are still there
# A member's death reaches its peers' collectives (an error) before the scheduler: how long a
# failed task waits for one of its group to be reported gone before its error counts as a bug.
LOSS_GRACE_S = 5.0
# A copy to one executor that keeps failing with its source and target alive (the store
# unreadable, the node's shared memory full) is not a preemption: after this many, stop.
MAX_COPY_FAILURES = 3


def live_workers(client: Client) -> list[str]:
    """The workers the scheduler knows now."""
    return sorted(worker_classes(client))


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
    copy_failures: dict = field(default_factory=dict)   # (executor, version) -> failed copies

    def __post_init__(self) -> None:

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

    def recheck(self, group: Group) -> bool:
        """Ask ``group``'s members which weights they hold; a member without the group's
        version (its process restarted at the same address) copies them again and the group
        is re-formed without it meanwhile. True if one was found."""
        from distributed import wait

        futures = self._ask_holds(group.members)
        # A member still blocked in the failed request's collective answers late: judge by
        # those that answer within the grace.
        try:
            wait(list(futures.values()), timeout=LOSS_GRACE_S)
        except TimeoutError:
            pass
        _check_pinned(self.client, list(futures.values()), set(group.members))
        wrong = self._not_held({m: f.result() for m, f in futures.items()
                                if f.status == "finished"})
        for event in wrong:
            self._carry_out(self.membership.handle(event))
        return bool(wrong)

    def _ask_holds(self, members) -> dict:
        """Each member's future answering which weights version it holds."""
        return {m: self.client.submit(executor.holds, workers=[m], pure=False,
                                      allow_other_workers=False) for m in sorted(members)}

    def _not_held(self, holds: dict[str, int]) -> list[WeightsNotHeld]:
        """The members whose answer is not the current version (logged): they copy again."""
        version = self.membership.version
        wrong = [WeightsNotHeld(m, v) for m, v in holds.items() if v != version]
        for event in wrong:
            self.log.append({"action": "not-held", "executor": event.executor,
                             "holds": event.holds, "wanted": version})
        return wrong

    def forward(self, group: Group, inputs: dict):
        """One SP forward of ``inputs`` on ``group``: the whole output."""
        return self.submit(group, executor.forward, inputs)[0].result()

    def submit(self, group: Group, fn, *args, **kwargs):
        """``fn(group.epoch, *args, **kwargs)`` on every member of ``group`` at once (an SP
        request); the futures in rank order -- rank 0's holds the result."""
        return [self.client.submit(fn, group.epoch, *args, **kwargs, workers=[m], pure=False,
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
                # Every copy under way was cancelled: issue each wanted one again, once.
                actions = [a for a in self.membership.handle(ExecutorLost(gone.address))
                           if not isinstance(a, CopyWeights)] + self.membership.pending_copies()
        return [g for g in formed if g.name in self.membership.groups]

    def _step(self, actions: list) -> list[Group]:
        formed: list[Group] = []
        while actions:
            copies = [a for a in actions if isinstance(a, CopyWeights)]
            # Events handled together may form a group and dissolve it again: form only
            # the groups that stand, and whose members all hold the version now.
            serving = self.membership.serving()
            forms = [a.group for a in actions if isinstance(a, FormGroup) and a.group in serving]
            for action in actions:
                if isinstance(action, DissolveGroup):
                    self.log.append({"action": "dissolve", "group": action.group.name,
                                     "reason": action.reason})
            standing, refused = self._form(forms)
            formed += standing
            # A copy from a peer that is itself still receiving the version waits a round.
            copies = list({c.executor: c for c in copies}.values())   # the last one wanted
            targets = {c.executor for c in copies}
            later = [c for c in copies if c.source in targets]
            actions = [a for event in refused + self._copy([c for c in copies if c not in later])
                       for a in self.membership.handle(event)]
            actions += [c for c in later if self.membership.copies.get(c.executor) == c]
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
        events: list = []
        for copy, outcome in zip(copies, await_outcomes(self.client, futures, pinned)):
            if not isinstance(outcome, BaseException):
                self.log.append({"action": "copy", "executor": copy.executor, "via": copy.via,
                                 "s": time.perf_counter() - started, **outcome})
                events.append(WeightsLoaded(copy.executor, copy.version))
                continue
            events += self._copy_failed(copy, outcome)
        return events

    def _copy_failed(self, copy: CopyWeights, error: BaseException) -> list:
        """A copy raised with its source and target alive: copy again (from elsewhere, if
        the source turned out not to hold the version), up to :data:`MAX_COPY_FAILURES`."""
        key = (copy.executor, copy.version)
        self.copy_failures[key] = self.copy_failures.get(key, 0) + 1
        self.log.append({"action": "copy-failed", "executor": copy.executor, "via": copy.via,
                         "source": copy.source, "error": f"{type(error).__name__}: {error}"})
        if self.copy_failures[key] > MAX_COPY_FAILURES:
            raise RuntimeError(
                f"copying weights version {copy.version} to executor {copy.executor} failed "
                f"{MAX_COPY_FAILURES + 1} times with both ends alive; the last time from "
                f"{copy.source or 'the run store'} ({copy.via}): {type(error).__name__}: "
                f"{error}. Check that the run store {self.url} is readable from the workers and "
                "that the node's shared memory (/dev/shm) has room") from error
        events: list = []
        if isinstance(error, executor.WeightsNotHeldError) and copy.source is not None:
            events.append(WeightsNotHeld(copy.source, error.holds))
        return events + [CopyFailed(copy.executor, copy.version)]

    def _form(self, groups: list[Group]) -> tuple[list[Group], list[WeightsNotHeld]]:
        """A rendezvous on each group's rank 0 while every member is asked which weights it
        holds; then all members of the groups whose members hold the version join at once.
        Returns the groups formed, and the members found without the version (restarted at
        the same address, a copy that failed silently): they copy again, and their groups
        are formed once they hold it."""
        if not groups:
            return [], []
        started = time.perf_counter()
        version = self.membership.version
        members = {m for g in groups for m in g.members}
        held = self._ask_holds(members)
        rendezvous = [self.client.submit(executor.open_rendezvous, workers=[g.members[0]],
                                         pure=False, allow_other_workers=False) for g in groups]
        answers = self._await(list(held.values()) + rendezvous, members)
        holds = dict(zip(held, answers))
        refused = self._not_held(holds)
        ready = [(g, place) for g, place in zip(groups, answers[len(held):])
                 if all(holds[m] == version for m in g.members)]
        joins = []
        for group, place in ready:
            joins += [self.client.submit(executor.join, group.epoch, rank, group.degree, *place,
                                         version, workers=[member], pure=False,
                                         allow_other_workers=False)
                      for rank, member in enumerate(group.members)]
        results = self._await(joins, members)
        if ready:
            self.log.append({"action": "form", "groups": [g.members for g, _ in ready],
                             "s": time.perf_counter() - started,
                             "communicator_s": max(r["communicator_s"] for r in results)})
        return [g for g, _ in ready], refused


def await_pinned(client: Client, futures: list, pinned: set[str]) -> list:
    """The results of ``futures`` pinned to the ``pinned`` workers; :class:`ExecutorGone` as
    soon as one of those workers has left the cluster (a task pinned to it would wait for
    ever)."""
    outcomes = await_outcomes(client, futures, pinned)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]   # an error with nobody lost is the task's own
    return outcomes


def await_outcomes(client: Client, futures: list, pinned: set[str]) -> list:
    """Like :func:`await_pinned`, but each future's result or the exception it raised (a
    lost pinned worker still raises :class:`ExecutorGone`)."""
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
        while not all(f.done() for f in futures):   # the rest finish, or fail on their own
            _check_pinned(client, futures, pinned)
            time.sleep(POLL_S)
    return [f.exception() if f.status == "error" else f.result() for f in futures]


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
