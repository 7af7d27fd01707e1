"""SP groups under the pull dispatcher: each serving group is one dispatcher worker.

Requests wait in the project's dispatcher (:mod:`spotlight.scheduling.dispatch`); a group pulls
one when it is free. When an executor is lost, the groups the membership dissolves are workers
lost to the dispatcher -- their requests go back to the front of the queue with their committed
step -- and the groups it forms are workers joining. A request runs one function on every
member of the group (the pipeline's SP rollout request, or bench sp's
:func:`pipelines.bench.sp_requests.denoise`) that commits every step to the run store, so a
request cut by a loss resumes on whatever group pulls it next, of whatever degree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from pipelines.parallel.groups import LOSS_GRACE_S, ExecutorGone, SPGroups, live_workers
from spotlight.scheduling.dispatch import (
    Assign,
    Dispatcher,
    RequestDone,
    RequestsSubmitted,
    WorkerJoined,
    WorkerLost,
)

FETCH_TIMEOUT_S = 5.0   # fetching a finished answer; past it, its worker may have died holding it


@dataclass
class Served:
    """What serving the requests did."""

    results: dict = field(default_factory=dict)        # request -> rank 0's result
    # request -> the step its last attempt began at
    resumed_from: dict = field(default_factory=dict)
    attempts: dict = field(default_factory=dict)       # request -> attempts started
    losses: int = 0


class GroupRequestFailed(RuntimeError):
    """A request failed on a group that lost nobody: a bug, not a preemption."""


class GroupServer:
    """Serve ``requests`` (name -> ``(fn, args)``) on ``sp``'s groups: ``fn(epoch, *args)`` runs
    on every member of a group at once and rank 0 returns the request's result. The executors
    follow ``members()`` (addresses; default every live worker): one gone is lost, one new
    joins."""

    def __init__(self, sp: SPGroups, requests: dict, *,
                 members: Callable[[], list[str]] | None = None,
                 worker_class: str = "spot", lease_epoch: int | None = None) -> None:
        self.sp, self.requests, self.worker_class = sp, requests, worker_class
        # With the driver's lease epoch, every attempt is told its number (``attempt=``, the
        # run store's fencing token of the request, :mod:`storage.attempts`).
        self.lease_epoch = lease_epoch
        self.members = members or (lambda: live_workers(sp.client))
        self.dispatcher = Dispatcher()
        self.running: dict = {}   # rank 0's future -> (request, attempt, group, all futures)
        self.served = Served()
        self._groups: set[str] = set()

    def run(self, on_tick: Callable[["GroupServer"], None] = lambda server: None,
            poll_s: float = 0.05) -> Served:
        """Until every request is done; ``on_tick`` may kill executors (a preemption) between
        polls."""
        self._sync_groups()
        self._apply(self.dispatcher.handle(RequestsSubmitted(tuple(self.requests))))
        while not self.dispatcher.finished:
            done = [f for f in self.running if f.done()]
            if not done:
                time.sleep(poll_s)
            for future in done:
                self._finished(future)
            on_tick(self)
            self.follow_cluster()
            self._forget_broken()
        return self.served

    def follow_cluster(self) -> None:
        """Executors whose workers left are lost; workers not yet executors join."""
        current = set(self.members())
        known = self.sp.membership.executors
        for address in sorted(a for a, e in known.items()
                              if a not in current and e.state.value != "gone"):
            self.lost(address)
        fresh = sorted(current - set(known))
        if fresh:
            self.joined(fresh)

    def _forget_broken(self) -> None:
        """Stop waiting on attempts whose group was dissolved: the dispatcher has requeued
        their requests, and a result lost with a dead rank 0 would never come."""
        for future, (_, _, group, _) in list(self.running.items()):
            if group not in self.sp.membership.groups and not future.done():
                del self.running[future]

    # -- membership <-> dispatcher --------------------------------------------------------------
    def lost(self, address: str) -> None:
        """An executor is gone: its groups leave the dispatcher, the regrouped ones join."""
        executor_ = self.sp.membership.executors.get(address)
        if executor_ is None or executor_.state.value == "gone":
            return
        self.served.losses += 1
        self.sp.lost(address)
        self._sync_groups()

    def joined(self, addresses: list[str]) -> None:
        self.sp.add(addresses)
        self._sync_groups()

    def _sync_groups(self) -> None:
        serving = {g.name for g in self.sp.membership.serving()}
        for name in sorted(self._groups - serving):
            self._groups.discard(name)
            self._apply(self.dispatcher.handle(WorkerLost(name)))
        for name in sorted(serving - self._groups):
            self._groups.add(name)
            self._apply(self.dispatcher.handle(WorkerJoined(name, 1, self.worker_class)))

    # -- requests ----------------------------------------------------------------------------------
    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Assign):
                group = self.sp.membership.groups[action.worker]
                fn, args = self.requests[action.request]
                kwargs = {} if self.lease_epoch is None else \
                    {"attempt": (self.lease_epoch, action.attempt)}
                futures = self.sp.submit(group, fn, *args, **kwargs)
                self.running[futures[0]] = (action.request, action.attempt, group.name, futures)
                self.served.attempts[action.request] = action.attempt

    def _finished(self, future) -> None:
        request, attempt, group, futures = self.running.pop(future)
        # Rank 0's answer is the request's; the other members' futures are dropped unread (a
        # finished one whose worker died since would be recomputed, pinned to that worker).
        del futures
        if future.status == "error":
            self._failed(request, group, future.exception())
            return
        if future.status != "finished":
            return   # its group broke: the loss requeues the request (resumed from its commits)
        try:
            out = future.result(timeout=FETCH_TIMEOUT_S)
        except TimeoutError:
            # Rank 0 died after it finished, before its answer came: Dask would wait for ever to
            # recompute it on that pinned worker. Its group's loss requeues the request, which
            # resumes from its commits; until the loss is seen, look again next poll.
            if group in self.sp.membership.groups:
                self.running[future] = (request, attempt, group, [future])
            return
        self.served.results[request] = out
        # A request's answer says which step its attempt resumed from (RolledOut, Denoised).
        self.served.resumed_from[request] = out.resumed_from
        self._apply(self.dispatcher.handle(RequestDone(request, attempt)))

    def _failed(self, request: str, group: str, error: BaseException) -> None:
        """An attempt raised. If its group lost a member (now or within
        :data:`LOSS_GRACE_S`), that loss requeues it; if a member's process no longer holds
        the group's weights (restarted at the same address), it copies them again and the
        request is requeued; otherwise the request itself is broken and serving stops, naming
        it -- retrying would fail the same way for ever."""
        members = self.sp.membership.groups.get(group)
        deadline = time.monotonic() + LOSS_GRACE_S
        while members is not None and time.monotonic() < deadline:
            gone = set(members.members) - set(self.members())
            if gone:
                for address in sorted(gone):
                    self.lost(address)
                return
            time.sleep(0.05)
        if members is not None and group in self.sp.membership.groups:
            try:
                if self.sp.recheck(members):
                    self._sync_groups()
                    return
            except ExecutorGone as lost:
                self.lost(lost.address)
                return
        if members is None:
            return   # dissolved already: requeued by the loss that dissolved it
        raise GroupRequestFailed(
            f"request {request!r} failed on SP group {group} ({', '.join(members.members)}), "
            f"which lost no member: {type(error).__name__}: {error}") from error
