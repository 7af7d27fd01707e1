"""SP groups under the pull dispatcher: each serving group is one dispatcher worker.

Requests wait in the project's dispatcher (:mod:`spotlight.scheduling.dispatch`); a group pulls
one when it is free. When an executor is lost, the groups the membership dissolves are workers
lost to the dispatcher -- their requests go back to the front of the queue with their committed
step -- and the groups it forms are workers joining. A request runs
:func:`pipelines.parallel.executor.denoise`, which commits every step to the run store, so a
request cut by a loss resumes on whatever group pulls it next, of whatever degree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from pipelines.parallel import executor
from pipelines.parallel.groups import SPGroups, kill_executors, live_workers
from spotlight.scheduling.dispatch import (Assign, Dispatcher, RequestDone, RequestsSubmitted,
                                           WorkerJoined, WorkerLost)


@dataclass
class Served:
    """What serving the requests did."""

    results: dict = field(default_factory=dict)        # request -> final latents
    resumed_from: dict = field(default_factory=dict)   # request -> the step its last attempt began at
    attempts: dict = field(default_factory=dict)       # request -> attempts started
    losses: int = 0


class GroupServer:
    """Serve ``requests`` (name -> denoise inputs) of ``steps`` steps on ``sp``'s groups,
    committing to the run store at ``url``."""

    def __init__(self, sp: SPGroups, requests: dict, steps: int, url: str) -> None:
        self.sp, self.requests, self.steps, self.url = sp, requests, steps, url
        self.dispatcher = Dispatcher()
        self.running: dict = {}   # rank 0's future -> (request, attempt, group, all futures)
        self.served = Served()
        self._groups: set[str] = set()

    def run(self, on_tick: Callable[["GroupServer"], None] = lambda server: None,
            poll_s: float = 0.05) -> Served:
        """Until every request is done; ``on_tick`` may kill executors (a preemption) or add
        newcomers between polls."""
        self._sync_groups()
        self._apply(self.dispatcher.handle(RequestsSubmitted(tuple(self.requests))))
        while not self.dispatcher.finished:
            done = [f for f in self.running if f.done()]
            if not done:
                time.sleep(poll_s)
            for future in done:
                self._finished(future)
            on_tick(self)
            self._sync_groups()
            self._forget_broken()
        return self.served

    def _forget_broken(self) -> None:
        """Stop waiting on attempts whose group was dissolved: the dispatcher has requeued
        their requests, and a result lost with a dead rank 0 would never come."""
        for future, (_, _, group, _) in list(self.running.items()):
            if group not in self.sp.membership.groups and not future.done():
                del self.running[future]

    # -- membership <-> dispatcher --------------------------------------------------------------
    def lost(self, address: str) -> None:
        """An executor is gone: its groups leave the dispatcher, the regrouped ones join."""
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
            self._apply(self.dispatcher.handle(WorkerJoined(name, 1, "spot")))

    # -- requests ----------------------------------------------------------------------------------
    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Assign):
                group = self.sp.membership.groups[action.worker]
                futures = self.sp.submit(group, executor.denoise, self.requests[action.request],
                                         self.steps, self.url, action.request)
                self.running[futures[0]] = (action.request, action.attempt, group.name, futures)
                self.served.attempts[action.request] = action.attempt

    def _finished(self, future) -> None:
        request, attempt, group, futures = self.running.pop(future)
        # Rank 0's answer is the request's; the other members' futures are dropped unread (a
        # finished one whose worker died since would be recomputed, pinned to that worker).
        del futures
        if future.status != "finished":
            return   # its group broke: the loss requeues the request (resumed from its commits)
        out = future.result()
        self.served.results[request] = out["latents"]
        self.served.resumed_from[request] = out["resumed_from"]
        self._apply(self.dispatcher.handle(RequestDone(request, attempt)))


Condition = Callable[["GroupServer"], "str | None"]


def kill_when(conditions: list[Condition]) -> Callable[["GroupServer"], None]:
    """An ``on_tick`` that, each time the next of ``conditions`` names a busy group, SIGKILLs
    that group's last member and reports the loss; and lets the fresh processes the nannies
    start rejoin (copying the weights from a peer)."""
    left = list(conditions)

    def tick(server: GroupServer) -> None:
        client = server.sp.client
        known = set(server.sp.membership.executors)
        fresh = [w for w in live_workers(client) if w not in known]
        if fresh:
            server.joined(fresh)
        group = left[0](server) if left else None
        if group is None or group not in server.sp.membership.groups:
            return
        left.pop(0)
        victim = server.sp.membership.groups[group].members[-1]
        kill_executors(client, [victim])
        while victim in live_workers(client):
            time.sleep(0.005)
        server.lost(victim)

    return tick


def _busy(server: GroupServer) -> list[tuple[str, str]]:
    """(request, group) of every running request whose group still stands, by group name."""
    return sorted((request, group) for request, _, group, _ in server.running.values()
                  if group in server.sp.membership.groups)


def after_seconds(seconds: float) -> Condition:
    """The first busy group, ``seconds`` after serving began (a trace's next preemption)."""
    start: list[float] = []

    def due(server: GroupServer) -> str | None:
        start.append(start[0] if start else time.perf_counter())
        busy = _busy(server)
        return busy[0][1] if busy and time.perf_counter() - start[0] >= seconds else None

    return due


def after_committed(steps: int) -> Condition:
    """The group of a running request that has committed at least ``steps`` steps."""
    from storage import RunStore

    def due(server: GroupServer) -> str | None:
        store = RunStore.open(server.url, create=False)
        return next((group for request, group in _busy(server)
                     if (store.resume_point("sp", request) or (0,))[0] >= steps), None)

    return due
