"""Chaos for SP groups under a :class:`~pipelines.parallel.serve.GroupServer`: an ``on_tick``
that SIGKILLs a busy group's member when a condition comes due (bench sp's trace, the tests'
"after N committed steps")."""
from __future__ import annotations

import time
from typing import Callable

from pipelines.parallel.groups import kill_executors, live_workers
from pipelines.parallel.serve import GroupServer
from storage import RunStore

Condition = Callable[["GroupServer"], "str | None"]


def kill_when(conditions: list[Condition]) -> Callable[["GroupServer"], None]:
    """An ``on_tick`` that, each time the next of ``conditions`` names a busy group, SIGKILLs
    that group's last member and reports the loss (the fresh process its nanny starts joins
    through :meth:`GroupServer.follow_cluster`, copying the weights from a peer)."""
    left = list(conditions)

    def tick(server: GroupServer) -> None:
        client = server.sp.client
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


def after_committed(steps: int, url: str, stage: str = "sp") -> Condition:
    """The group of a running request that has committed at least ``steps`` steps to the run
    store at ``url``."""

    def due(server: GroupServer) -> str | None:
        store = RunStore.open(url, create=False)
        return next((group for request, group in _busy(server)
                     if (store.resume_point(stage, request) or (0,))[0] >= steps), None)

    return due
