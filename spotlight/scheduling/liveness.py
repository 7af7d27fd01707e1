"""Liveness: a worker whose heartbeats stop, or whose requests stop committing steps, is taken
as cut off.

A worker behind a network partition keeps running (and may write later), but the scheduler
only drops it when Dask's worker TTL (5 minutes by default) or a TCP time-out runs out. Its
requests should move long before that. Every running request commits a step every few seconds
(its latent goes to the run store after each denoising step), so silence is the signal: a
request with no new committed step for ``factor`` times the measured step time (at least
``floor_s``) has a silent worker, and every request on that worker is given up on there. An
attempt's first step may include loading weights (a new version every iteration), so until it
commits one it is allowed ``cold_s``.

Heartbeats come first (:func:`unheard`): the scheduler's record of when it last heard from each
worker finds a partition in a fixed time, whatever the step time -- a 1280² Qwen-Image step of
5.5 s would make 20 step times almost two minutes. Progress stays for a worker that still
reaches the scheduler but not the store.

Pure: the glue feeds it the attempts it starts, the committed steps it reads from the run store
and the scheduler's heartbeat times, with its clock; ``silent(now)`` and ``unheard`` name the
workers to treat as lost.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

LOOKS_PER_DEADLINE = 6


@dataclass(frozen=True)
class Liveness:
    factor: float = 20.0      # silent after this many measured step times without a commit
    floor_s: float = 60.0     # and never sooner (a first step includes loading weights)
    cold_s: float = 120.0     # the deadline of an attempt's first step (and before any step time)

    def __post_init__(self) -> None:
        if not (self.factor > 1 and 0 < self.floor_s <= self.cold_s):
            raise ValueError(f"Liveness needs factor > 1 and 0 < floor_s <= cold_s, got {self}")


@dataclass
class _Running:
    worker: str
    step: int
    since: float          # when the attempt started or last committed a new step
    moved: bool = False   # it committed a step since it started


@dataclass
class ProgressWatch:
    liveness: Liveness = field(default_factory=Liveness)
    running: dict[str, _Running] = field(default_factory=dict)
    step_s: deque = field(default_factory=lambda: deque(maxlen=64))   # measured s per step

    def started(self, request: str, worker: str, step: int, now: float) -> None:
        """An attempt of ``request`` started on ``worker`` from committed ``step``."""
        self.running[request] = _Running(worker, step, now)

    def progressed(self, request: str, step: int, now: float) -> None:
        """The run store holds ``step`` of ``request`` now (a step it had or a newer one)."""
        run = self.running.get(request)
        if run is None or step <= run.step:
            return
        self.step_s.append((now - run.since) / (step - run.step))
        run.step, run.since, run.moved = step, now, True

    def ended(self, request: str) -> None:
        self.running.pop(request, None)

    def deadline_s(self) -> float:
        """How long a running request may go without a new committed step."""
        if not self.step_s:
            return self.liveness.cold_s
        return max(self.liveness.floor_s, self.liveness.factor * statistics.median(self.step_s))

    def look_every_s(self, least_s: float) -> float:
        """How often to read the running requests' committed steps: a sixth of the deadline
        (a silence is found at most a sixth late), at least ``least_s``. At the default 60 s
        floor that is one read per running request every 10 s, not every ``least_s``: the
        store's request rate a wide run pays for liveness."""
        return max(least_s, self.deadline_s() / LOOKS_PER_DEADLINE)

    def silent(self, now: float) -> dict[str, float]:
        """Workers with a request silent past the deadline, and the longest silence of each."""
        deadline = self.deadline_s()
        first = max(deadline, self.liveness.cold_s)
        out: dict[str, float] = {}
        for run in self.running.values():
            quiet = now - run.since
            if quiet > (deadline if run.moved else first):
                out[run.worker] = max(out.get(run.worker, 0.0), quiet)
        return out

    def forget_worker(self, worker: str) -> list[str]:
        """Stop watching ``worker``'s requests (it was lost); returns them."""
        gone = [r for r, run in self.running.items() if run.worker == worker]
        for request in gone:
            del self.running[request]
        return gone


def unheard(last_seen: dict[str, float], watched: Iterable[str],
            limit_s: float) -> dict[str, float]:
    """Workers of ``watched`` the scheduler has not heard from (``last_seen``: each worker's
    last heartbeat, on the scheduler's clock) for longer than ``limit_s``, with how long.

    Silence is measured against the freshest heartbeat of any worker -- a healthy worker beats
    every second or so -- rather than against this host's clock, so clock skew between the
    scheduler's host and the driver's does not count. A partition stops a worker's heartbeats
    whatever its step time: this finds it in ``limit_s``, where committed steps need many step
    times (:class:`ProgressWatch`, which still finds a worker that reaches the scheduler but not
    the store)."""
    if not last_seen:
        return {}
    newest = max(last_seen.values())
    return {w: newest - last_seen[w] for w in sorted(watched)
            if w in last_seen and newest - last_seen[w] > limit_s}


@dataclass
class CutOffs:
    """Workers cut off for silence, shared by a run's pools: when each was cut off, and which
    came back once already.

    A partition heals: the scheduler hears from the worker again (its ``last_seen`` moves past
    the moment it was cut off) and it may rejoin, once. A worker cut off again after that (it
    reaches the scheduler but not the store, say) stays out for the run rather than cost a
    liveness deadline per request."""

    at: dict[str, float] = field(default_factory=dict)   # worker -> when it was cut off
    rejoined: set[str] = field(default_factory=set)

    def cut(self, worker: str, now: float) -> None:
        self.at[worker] = now

    def __contains__(self, worker: object) -> bool:
        return worker in self.at

    def may_rejoin(self, worker: str, last_seen: float, grace_s: float) -> bool:
        """Whether a cut-off worker the scheduler last heard from at ``last_seen`` is back
        (``grace_s`` covers clock skew between the scheduler's host and this one); if so it
        is no longer cut off."""
        cut = self.at.get(worker)
        if cut is None or worker in self.rejoined or last_seen <= cut + grace_s:
            return False
        del self.at[worker]
        self.rejoined.add(worker)
        return True


@dataclass
class SilenceReports:
    """Workers unheard for ``limit_s`` (:func:`unheard`; 0: off), each named once until it is
    heard again: what a wait on single tasks -- reward, training, a checkpoint -- tells its
    operator. Those tasks are not moved: a partition that heals lets the task finish where it
    runs, and a worker gone for good is dropped by Dask (its worker TTL), which reruns the
    task and whatever it held on another worker of the class."""

    limit_s: float
    reported: set[str] = field(default_factory=set)

    def newly_silent(self, last_seen: dict[str, float],
                     watched: Iterable[str]) -> dict[str, float]:
        quiet = unheard(last_seen, watched, self.limit_s) if self.limit_s else {}
        fresh = {w: s for w, s in quiet.items() if w not in self.reported}
        self.reported = set(quiet)
        return fresh
