"""One stage of requests (a rollout, an exploration) run by the project's real pull dispatcher.

The stage is the glue that ``pipelines/cluster/dispatch.py`` is on a live cluster, with the
simulated clock in place of Dask: fleet changes become dispatcher events
(:class:`~spotlight.scheduling.dispatch.WorkerJoined`, ``NoticeReceived``, ``WorkerLost``), and
the dispatcher's actions are carried out (``Assign`` schedules the attempt's end, ``Cancel``
drops it). Whether a hard-killed request keeps its denoising steps depends on the system: with
``commit_steps`` every step is committed (Spotlight's latent stream) and the dispatcher is told
the request's progress before the loss; without it the request starts over. After a notice,
both hand a request back at its next step boundary (RLBoost's migration of preempted work).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotlight.scheduling.dispatch import (
    Assign,
    Cancel,
    Dispatcher,
    NoticeReceived,
    Offload,
    RequestDone,
    RequestPreempted,
    RequestProgressed,
    RequestsSubmitted,
    RequestState,
    StageClosed,
    WorkerJoined,
    WorkerLost,
)
from spotlight.sim.clock import Clock
from spotlight.sim.config import TimingConfig
from spotlight.sim.fleet import Fleet, Unit
from spotlight.sim.model import request_seconds, step_seconds


@dataclass(frozen=True)
class Work:
    """One request: ``batch`` images over ``steps`` denoising steps (reward included)."""

    name: str
    batch: int
    steps: int
    group: str = ""   # what it belongs to (a prompt): the group is done when all its work is
    seconds: float | None = None   # a recorded duration (a replayed run), instead of the model's


@dataclass
class Attempt:
    work: Work
    attempt: int
    unit: str
    start: float
    resume_step: int
    end: float


@dataclass
class StageStats:
    start: float
    end: float | None = None
    done: list[str] = field(default_factory=list)
    busy_s: dict[str, float] = field(default_factory=dict)     # GPU-seconds computed, per class
    unit_last_end: dict[str, float] = field(default_factory=dict)
    done_unit_s: float = 0.0          # seconds of the attempts that finished (a unit's time)
    done_sample_steps: int = 0        # their images x steps: seconds per sample-step measured
    hard_preemptions: int = 0
    graceful_preemptions: int = 0
    # unit, start, end, outcome
    spans: list[tuple[str, float, float, str]] = field(default_factory=list)


class RequestStage:
    """Run ``work`` on the ready units of ``classes`` until all is done or ``deadline``.

    ``join_after``: seconds after the stage starts before a class's units may pull (the spot
    GPUs receiving the new weights). ``keep_spans``: record every attempt (timeline plots).
    """

    def __init__(self, clock: Clock, fleet: Fleet, timing: TimingConfig, work: list[Work], *,
                 classes: tuple[str, ...], units: list[str] | None = None,
                 commit_steps: bool, offload: bool = False, deadline: float | None = None,
                 join_after: dict[str, float] | None = None, reward_s_per_image: float = 0.0,
                 keep_spans: bool = False, name: str = "stage") -> None:
        self.clock, self.fleet, self.timing, self.name = clock, fleet, timing, name
        self.classes, self.only = classes, set(units) if units is not None else None
        self.commit_steps, self.keep_spans = commit_steps, keep_spans
        self.reward_s_per_image = reward_s_per_image
        self.work = {w.name: w for w in work}
        self.dispatcher = Dispatcher(offload=Offload() if offload else None)
        self.live: dict[tuple[str, int], Attempt] = {}
        self.stats = StageStats(start=clock.now)
        self.closed = False
        self._joined: set[str] = set()
        self._left = len(work)
        fleet.listeners.append(self)
        for unit in fleet.ready_units():
            self._join_later(unit, (join_after or {}).get(unit.cls, 0.0))
        if work:
            self._apply(self.dispatcher.handle(RequestsSubmitted(tuple(w.name for w in work))))
        if deadline is not None:
            clock.at(deadline, self.close)
        if not work:
            self._finish()

    @property
    def finished(self) -> bool:
        return self.stats.end is not None

    def run(self) -> StageStats:
        self.clock.run_until(lambda: self.finished, f"stage {self.name}")
        return self.stats

    # -- fleet events --------------------------------------------------------------------------
    def _eligible(self, unit: Unit) -> bool:
        return unit.cls in self.classes and (self.only is None or unit.name in self.only)

    def _join_later(self, unit: Unit, delay: float) -> None:
        if delay > 0:
            self.clock.at(self.clock.now + delay, self._join, unit)
        else:
            self._join(unit)

    def _join(self, unit: Unit) -> None:
        if self.finished or not self._eligible(unit) or unit.name in self._joined:
            return
        if not unit.ready or unit.noticed or self.fleet.units.get(unit.name) is not unit:
            return
        self._joined.add(unit.name)
        self._apply(self.dispatcher.handle(WorkerJoined(unit.name, 1, unit.cls)))

    def unit_ready(self, unit: Unit) -> None:
        self._join(unit)   # a newcomer holds the current weights: it copied them from a peer

    def unit_notice(self, unit: Unit) -> None:
        if self.finished or unit.name not in self._joined:
            return
        self._apply(self.dispatcher.handle(NoticeReceived(unit.name)))
        for key, attempt in list(self.live.items()):
            if attempt.unit == unit.name:
                boundary = self._next_boundary(attempt)
                if boundary < attempt.end:
                    self.clock.at(boundary, self._hand_back, key)

    def unit_lost(self, unit: Unit) -> None:
        if self.finished or unit.name not in self._joined:
            return
        for key, attempt in sorted(self.live.items()):
            if attempt.unit == unit.name:
                if self.commit_steps:
                    step = self._steps_done(attempt)
                    self._apply(self.dispatcher.handle(RequestProgressed(key[0], step)))
                self._stop(key, "lost")
                self.stats.hard_preemptions += 1
        self._apply(self.dispatcher.handle(WorkerLost(unit.name)))

    # -- attempts ------------------------------------------------------------------------------
    def _per_step(self, work: Work) -> float:
        if work.seconds is not None:
            return work.seconds / max(work.steps, 1)
        return step_seconds(self.timing, work.batch)

    def _steps_done(self, attempt: Attempt) -> int:
        computing = self.clock.now - attempt.start - (self.timing.resume_s
                                                      if attempt.resume_step else 0.0)
        done = attempt.resume_step + int(max(computing, 0.0) // self._per_step(attempt.work))
        return min(done, attempt.work.steps)

    def _next_boundary(self, attempt: Attempt) -> float:
        offset = attempt.start + (self.timing.resume_s if attempt.resume_step else 0.0)
        per = self._per_step(attempt.work)
        return offset + math.ceil(max(self.clock.now - offset, 0.0) / per - 1e-9) * per

    def _hand_back(self, key: tuple[str, int]) -> None:
        attempt = self.live.get(key)
        if attempt is None or self.finished:
            return
        step = self._steps_done(attempt)
        self._stop(key, "handed back")
        self.stats.graceful_preemptions += 1
        self._apply(self.dispatcher.handle(RequestPreempted(key[0], key[1], step)))

    def _stop(self, key: tuple[str, int], outcome: str) -> None:
        attempt = self.live.pop(key)
        self._account(attempt, self.clock.now, outcome)

    def _account(self, attempt: Attempt, end: float, outcome: str) -> None:
        unit = self.fleet.units.get(attempt.unit)
        cls = unit.cls if unit is not None else ("gpu" if attempt.unit.startswith("od") else "spot")
        gpus = self.timing.sp_degree
        self.stats.busy_s[cls] = self.stats.busy_s.get(cls, 0.0) + (end - attempt.start) * gpus
        if self.keep_spans:
            self.stats.spans.append((attempt.unit, attempt.start, end,
                                     f"{self.name}:{outcome}"))

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Assign):
                work = self.work[action.request]
                if work.seconds is not None:
                    seconds = work.seconds * (1 - action.resume_step / max(work.steps, 1))
                else:
                    seconds = request_seconds(self.timing, work.batch, work.steps,
                                              action.resume_step)
                seconds += work.batch * self.reward_s_per_image
                key = (action.request, action.attempt)
                start = self.clock.now + self.timing.dispatch_s   # it reaches its worker then
                self.live[key] = Attempt(work, action.attempt, action.worker, start,
                                         action.resume_step, start + seconds)
                self.clock.at(start + seconds, self._done, key)
            elif isinstance(action, Cancel):
                key = (action.request, action.attempt)
                if key in self.live:
                    self._stop(key, "cancelled")

    def _done(self, key: tuple[str, int]) -> None:
        attempt = self.live.get(key)
        if attempt is None or self.finished:
            return   # lost, handed back or cancelled meanwhile
        self._stop(key, "done")
        self.stats.unit_last_end[attempt.unit] = self.clock.now
        self.stats.done_unit_s += self.clock.now - attempt.start
        self.stats.done_sample_steps += attempt.work.batch * (attempt.work.steps
                                                              - attempt.resume_step)
        request = self.dispatcher.requests[key[0]]
        first = request.state is not RequestState.DONE
        self._apply(self.dispatcher.handle(RequestDone(key[0], key[1],
                                                       self.clock.now - attempt.start)))
        if first:
            self.stats.done.append(key[0])
            self._left -= 1
            if self._left == 0:
                self._finish()

    def close(self) -> None:
        """The deadline: whatever still runs is cancelled (its work is lost to this stage)."""
        if self.finished:
            return
        self._apply(self.dispatcher.handle(StageClosed()))
        self._finish()

    def _finish(self) -> None:
        self.stats.end = self.clock.now
        if self in self.fleet.listeners:
            self.fleet.listeners.remove(self)
