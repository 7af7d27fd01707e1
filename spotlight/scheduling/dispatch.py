"""Pull-based request dispatch under preemption, as a state machine: events in, actions out.

Requests (exploration replays, audits) wait in one queue. A worker holds at most ``slots``
requests and gets the next one only when a slot frees up, so a slow worker simply pulls fewer
and a preemption strands at most the requests in flight. Nothing here knows Dask: the glue in
``pipelines.cluster.dispatch`` turns scheduler observations into events and carries the actions out
(``Assign`` -> submit one attempt pinned to that worker, ``Cancel`` -> cancel it).

A request moves QUEUED -> RUNNING -> DONE (or CANCELLED when the stage closes). A worker lost
while running it (hard kill) or one that hands it back at a step boundary after a notice
(graceful) puts it back at the *front* of the queue: it holds committed steps and has waited
longest. Every attempt has its own number, so a late answer from an earlier attempt is
recognised; by the determinism contract any finished attempt gives the same result, so the
first answer wins and the others are cancelled.

With :class:`Offload` (see :mod:`spotlight.scheduling.offload`) the queue's tail goes to whoever
finishes it first by measured speed, and an idle worker of an ``offload.speculate_on`` class
re-runs a straggler: two live attempts, the first to finish wins, losing one requeues nothing.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from spotlight.scheduling.dispatch_events import (  # noqa: F401  (re-exported)
    Action,
    Assign,
    AttemptOvertaken,
    Cancel,
    Event,
    GaveUp,
    Ignored,
    NoticeReceived,
    RequestDone,
    RequestPreempted,
    RequestProgressed,
    RequestsSubmitted,
    RequestSubmitted,
    Requeued,
    ResultLost,
    Retired,
    StageClosed,
    Starved,
    Tick,
    WorkerJoined,
    WorkerLost,
)
from spotlight.scheduling.offload import SpeedBook, planned_takers, straggler


# --- state --------------------------------------------------------------------------------------
class RequestState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class WorkerState(Enum):
    ACTIVE = "active"
    DRAINING = "draining"   # noticed: finishing nothing new, handing back what it runs
    GONE = "gone"


@dataclass
class Request:
    name: str
    state: RequestState = RequestState.QUEUED
    attempt: int = 0            # attempts started so far; the newest is ``attempt``
    committed_step: int = 0
    hard_preemptions: int = 0
    graceful_preemptions: int = 0
    live: dict[int, str] = field(default_factory=dict)   # running attempt -> its worker
    started: dict[int, float] = field(default_factory=dict)   # running attempt -> when

    @property
    def worker(self) -> str | None:
        """The worker of the newest running attempt (None when none runs)."""
        return self.live[max(self.live)] if self.live else None

    @property
    def preemptions(self) -> int:
        return self.hard_preemptions + self.graceful_preemptions


@dataclass(frozen=True)
class Offload:
    """Adaptive offload: plan the tail by measured speed; re-run stragglers on idle workers of
    these classes when they would finish more than ``margin_s`` sooner."""

    speculate_on: tuple[str, ...] = ("gpu",)
    margin_s: float = 1.0


@dataclass
class Worker:
    name: str
    slots: int
    cls: str = "spot"
    state: WorkerState = WorkerState.ACTIVE
    running: set[str] = field(default_factory=set)
    assigned: int = 0           # requests this worker has pulled (balance)

    @property
    def free(self) -> int:
        return self.slots - len(self.running) if self.state is WorkerState.ACTIVE else 0


class Dispatcher:
    """The dispatch state of one stage's requests over a changing set of workers.

    ``no_worker_wait_s``: how long queued requests may wait with no worker at all before the
    stage gives up on them (None: for ever), measured on the clock of :class:`Tick` events.
    """

    def __init__(self, no_worker_wait_s: float | None = None,
                 offload: Offload | None = None) -> None:
        self.offload = offload
        self.speeds = SpeedBook()
        self.now = 0.0   # the clock of the newest Tick
        self.requests: dict[str, Request] = {}
        self.workers: dict[str, Worker] = {}
        self.queue: deque[str] = deque()
        # Indexes kept in step with the workers' states, so that a busy stage on hundreds of
        # workers does not scan them all at every event: who has a free slot, who drains, and
        # each worker's join order (the order workers pull in).
        self._with_room: set[str] = set()
        self._draining: set[str] = set()
        self._order: dict[str, int] = {}
        self._active_slots = 0   # slots of ACTIVE workers
        self._running: set[str] = set()   # requests with a live attempt (what may be twinned)
        # Every attempt started, in start order (the clock only moves forward); ended ones
        # are dropped lazily. The offload plan reads only its oldest entries.
        self._by_start: deque[tuple[float, str, int]] = deque()
        self.closed = False
        self.no_worker_wait_s = no_worker_wait_s
        self._starved = False
        self._starved_since: float | None = None

    # -- the one entry point ----------------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        """Apply ``event``; return what the glue must do (in order)."""
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise TypeError(f"Dispatcher.handle: {event!r} is not a dispatch event")
        actions = handler(event)
        return actions + self._fill_slots() + self._starvation()

    # -- queries ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every request is done or cancelled."""
        return all(r.state in (RequestState.DONE, RequestState.CANCELLED)
                   for r in self.requests.values())

    def count(self, state: RequestState) -> int:
        return sum(1 for r in self.requests.values() if r.state is state)

    def active_workers(self) -> list[str]:
        return [w.name for w in self.workers.values() if w.state is WorkerState.ACTIVE]

    # -- handlers --------------------------------------------------------------------------
    def _on_WorkerJoined(self, event: WorkerJoined) -> list[Action]:
        if event.slots < 1:
            raise ValueError(f"worker {event.worker!r} joined with {event.slots} slots; needs ≥ 1")
        known = self.workers.get(event.worker)
        if known is not None and known.state is not WorkerState.GONE:
            return [Ignored(event, f"worker {event.worker} is already known ({known.state.value})")]
        self.workers[event.worker] = Worker(event.worker, event.slots, event.cls)
        self._active_slots += event.slots
        self._order.setdefault(event.worker, len(self._order))
        self._refresh(self.workers[event.worker])
        self.speeds.joined(event.worker, event.cls)
        return []

    def _on_NoticeReceived(self, event: NoticeReceived) -> list[Action]:
        worker = self.workers.get(event.worker)
        if worker is None:
            return [Ignored(event, f"preemption notice for unknown worker {event.worker!r} "
                                   f"(known: {sorted(self.workers) or 'none'}); nothing to drain")]
        if worker.state is not WorkerState.ACTIVE:
            return [Ignored(event, f"worker {event.worker} is already {worker.state.value}")]
        worker.state = WorkerState.DRAINING
        self._active_slots -= worker.slots
        self._draining.add(worker.name)
        self._refresh(worker)
        return self._retire_drained()

    def _on_WorkerLost(self, event: WorkerLost) -> list[Action]:
        worker = self.workers.get(event.worker)
        if worker is None or worker.state is WorkerState.GONE:
            return [Ignored(event, f"worker {event.worker!r} was not active")]
        if worker.state is WorkerState.ACTIVE:
            self._active_slots -= worker.slots
        worker.state = WorkerState.GONE
        self._draining.discard(worker.name)
        self._refresh(worker)
        actions: list[Action] = []
        for name in sorted(worker.running, reverse=True):   # front of the queue, stable order
            request = self.requests[name]
            request.hard_preemptions += 1
            self._drop_attempts(request, worker.name)
            if not request.live:   # no other attempt carries it on
                self._requeue(request)
                actions.append(Requeued(name, worker.name, request.committed_step, hard=True))
        worker.running.clear()
        return actions[::-1]

    def _on_RequestSubmitted(self, event: RequestSubmitted) -> list[Action]:
        if self.closed:
            raise RuntimeError(f"request {event.request!r} submitted after the stage closed")
        if event.request in self.requests:
            raise ValueError(f"request {event.request!r} was submitted twice")
        self.requests[event.request] = Request(event.request)
        self.queue.append(event.request)
        return []

    def _on_RequestsSubmitted(self, event: RequestsSubmitted) -> list[Action]:
        for name in event.requests:
            self._on_RequestSubmitted(RequestSubmitted(name))
        return []

    def _on_RequestProgressed(self, event: RequestProgressed) -> list[Action]:
        request = self.requests.get(event.request)
        if request is None:
            return [Ignored(event, f"unknown request {event.request!r}")]
        request.committed_step = max(request.committed_step, event.step)
        return []

    def _on_RequestDone(self, event: RequestDone) -> list[Action]:
        request = self.requests.get(event.request)
        if request is None:
            return [Ignored(event, f"unknown request {event.request!r}")]
        if request.state is RequestState.DONE:
            return [Ignored(event, f"request {event.request} was already done")]
        actions: list[Action] = []
        finished_on = request.live.get(event.attempt)
        if event.seconds is not None and finished_on is not None:
            self.speeds.observe(finished_on, event.seconds)
        # Any other attempt (an earlier one answered after all, or a speculative twin): the
        # first answer is as good as any; stop the rest.
        actions += [Cancel(request.name, worker, attempt)
                    for attempt, worker in sorted(request.live.items())
                    if attempt != event.attempt]
        self._release(request)
        if request.state is RequestState.QUEUED:   # (queued is exactly: in the queue)
            self.queue.remove(request.name)
        request.state = RequestState.DONE
        self._running.discard(request.name)
        return actions + self._retire_drained()

    def _on_RequestPreempted(self, event: RequestPreempted) -> list[Action]:
        request = self.requests.get(event.request)
        if request is None:
            return [Ignored(event, f"unknown request {event.request!r}")]
        if request.state is not RequestState.RUNNING or event.attempt not in request.live:
            request.committed_step = max(request.committed_step, event.step)
            return [Ignored(event, f"attempt {event.attempt} of {event.request} is not running")]
        worker = request.live[event.attempt]
        request.committed_step = max(request.committed_step, event.step)
        request.graceful_preemptions += 1
        self._drop_attempts(request, worker)
        if request.live:   # its twin runs on
            return self._retire_drained()
        self._requeue(request)
        return [Requeued(request.name, worker, request.committed_step, hard=False)] \
            + self._retire_drained()

    def _on_AttemptOvertaken(self, event: AttemptOvertaken) -> list[Action]:
        request = self.requests.get(event.request)
        if request is None or request.state is not RequestState.RUNNING or \
                event.attempt not in request.live:
            return [Ignored(event, f"attempt {event.attempt} of {event.request} is not running")]
        worker = request.live[event.attempt]
        request.committed_step = max(request.committed_step, event.step)
        self._drop_attempts(request, worker)
        if request.live:   # the twin that overtook it runs on
            return self._retire_drained()
        self._requeue(request)   # the twin is gone too: go on from what it committed
        return [Requeued(request.name, worker, request.committed_step, hard=False)] \
            + self._retire_drained()

    def _on_ResultLost(self, event: ResultLost) -> list[Action]:
        request = self.requests.get(event.request)
        if request is None or request.state is not RequestState.RUNNING or \
                event.attempt not in request.live:
            return [Ignored(event, f"attempt {event.attempt} of {event.request} is not running")]
        request.committed_step = max(request.committed_step, event.step)
        if not event.worker_alive:   # the result went with its worker: a hard loss of it all
            return self._on_WorkerLost(WorkerLost(event.worker))
        request.hard_preemptions += 1   # computed, then lost in transit: run it again
        self._drop_attempts(request, event.worker)
        if request.live:
            return []
        self._requeue(request)
        return [Requeued(request.name, event.worker, request.committed_step, hard=True)]

    def _on_Tick(self, event: Tick) -> list[Action]:
        self.now = max(self.now, event.now)
        starved = bool(self.queue) and not self.closed and not self.active_workers() \
            and not event.arriving
        if not starved:
            self._starved_since = None
            return []
        if self._starved_since is None:
            self._starved_since = event.now
        waited = event.now - self._starved_since
        if self.no_worker_wait_s is None or waited < self.no_worker_wait_s:
            return []
        waiting = len(self.queue)
        return [GaveUp(waited, waiting)] + self._on_StageClosed(StageClosed())

    def _on_StageClosed(self, event: StageClosed) -> list[Action]:
        self.closed = True
        actions: list[Action] = []
        for request in self.requests.values():
            if request.state is RequestState.RUNNING:
                actions += [Cancel(request.name, worker, attempt)
                            for attempt, worker in sorted(request.live.items())]
                self._release(request)
            if request.state in (RequestState.RUNNING, RequestState.QUEUED):
                request.state = RequestState.CANCELLED
                self._running.discard(request.name)
        self.queue.clear()
        return actions

    # -- helpers ---------------------------------------------------------------------------
    def _requeue(self, request: Request) -> None:
        request.state = RequestState.QUEUED
        self._running.discard(request.name)
        self.queue.appendleft(request.name)

    def _release(self, request: Request) -> None:
        """Every attempt of ``request`` stops holding its worker's slot."""
        for worker in set(request.live.values()):
            self._drop_attempts(request, worker)

    def _drop_attempts(self, request: Request, worker_name: str) -> None:
        for attempt in [a for a, w in request.live.items() if w == worker_name]:
            del request.live[attempt]
            request.started.pop(attempt, None)
        worker = self.workers.get(worker_name)
        if worker is not None:
            worker.running.discard(request.name)
            self._refresh(worker)

    def _retire_drained(self) -> list[Action]:
        out: list[Action] = []
        for name in self._in_order(self._draining):
            worker = self.workers[name]
            if not worker.running:
                worker.state = WorkerState.GONE
                self._draining.discard(name)
                out.append(Retired(worker.name))
        return out

    def _in_order(self, names: set[str]) -> list[str]:
        """``names`` in the order their workers joined (the order of ``self.workers``)."""
        return sorted(names, key=self._order.__getitem__)

    def _refresh(self, worker: Worker) -> None:
        """Keep the free-slot index in step with ``worker``'s state and running set."""
        if worker.free > 0:
            self._with_room.add(worker.name)
        else:
            self._with_room.discard(worker.name)

    def _fill_slots(self) -> list[Action]:
        """Hand queued requests to workers with room, one per worker per round: pull order."""
        actions: list[Action] = []
        if self.closed:
            return actions
        while self.queue:
            takers = self._takers()
            if not takers:
                break
            for worker in takers:
                if not self.queue:
                    break
                actions.append(self._start(self.requests[self.queue.popleft()], worker))
        if self.offload is not None and not self.queue:
            actions += self._speculate()
        return actions

    def _start(self, request: Request, worker: Worker) -> Assign:
        request.state = RequestState.RUNNING
        self._running.add(request.name)
        request.attempt += 1
        request.live[request.attempt] = worker.name
        request.started[request.attempt] = self.now
        self._by_start.append((self.now, request.name, request.attempt))
        worker.running.add(request.name)
        self._refresh(worker)
        worker.assigned += 1
        return Assign(request.name, worker.name, request.attempt, request.committed_step)

    def _takers(self) -> list[Worker]:
        """Workers with a free slot that should pull now (with offload: those the
        earliest-finish plan of the queue uses)."""
        free = [self.workers[n] for n in self._in_order(self._with_room)]
        if self.offload is None or not free or not self.speeds.seconds \
                or self._queue_outlasts(free):
            return free   # (nothing measured yet: no plan to make, every free worker pulls)
        speeds = {w.name: self.speeds.estimate(w.name) for w in free}
        ready = self._ready_times(free, speeds)
        chosen = set(planned_takers([w.name for w in free], ready, speeds, len(self.queue)))
        return [w for w in free if w.name in chosen]

    def _queue_outlasts(self, free: list[Worker]) -> bool:
        """True when the earliest-finish plan surely gives every free worker a request: even
        if every active slot were free now and ran at the fastest speed ever measured, it
        could finish at most ``slots x floor(slowest free / fastest)`` requests by the time
        the slowest free worker finishes its first -- fewer than wait. Exact, and it spares
        planning the whole queue while most of a stage is still queued."""
        estimates = [self.speeds.estimate(w.name) for w in free]
        bounds = self.speeds.bounds()
        if bounds is None or None in estimates or bounds[0] <= 0:
            return False
        return len(self.queue) > self._active_slots * math.floor(max(estimates) / bounds[0])

    def _ready_times(self, free: list[Worker],
                     speeds: dict[str, float | None]) -> dict[str, list[float]]:
        """When each slot that can matter to the plan is expected to be free (now, for a free
        slot). The plan only asks which free workers get a request, so it stops by the time
        the slowest free worker would finish one (the horizon): a busy slot whose next request
        would finish later never takes part. Such a slot started its request after
        ``horizon - 2 x fastest``, so only attempts started before that (in start order,
        oldest first) are looked at -- not every running one. ``speeds`` gains
        the estimates of the busy workers included."""
        fastest = self.speeds.bounds()[0]
        horizon = max(self.now + speeds[w.name] for w in free)
        # (An overdue attempt started before ``now - fastest``, which is no later: the horizon
        # is at least ``now + fastest``.) A margin for the rounding of ``started + s + s``.
        cutoff = horizon - 2 * fastest + 1e-9 * (1 + abs(horizon))
        busy: dict[str, list[float]] = {w.name: [] for w in free}
        while self._by_start and self._by_start[0][2] not in \
                self.requests[self._by_start[0][1]].live:
            self._by_start.popleft()   # finished, lost or handed back: forget it
        for started, name, attempt in self._by_start:
            if started > cutoff:
                break
            worker = self.requests[name].live.get(attempt)
            if worker is None or self.workers[worker].state is not WorkerState.ACTIVE:
                continue
            if worker not in speeds:
                speeds[worker] = self.speeds.estimate(worker)
            busy.setdefault(worker, []).append(max(self.now, started + (speeds[worker] or 0.0)))
        return {name: sorted(slots) + [self.now] * self.workers[name].free
                for name, slots in busy.items()}

    def _speculate(self) -> list[Action]:
        """Idle workers of the speculating classes re-run the request expected to end last,
        when they would clearly finish it sooner (one twin per request)."""
        actions: list[Action] = []
        bounds = self.speeds.bounds()
        if bounds is None or bounds[1] <= bounds[0] + self.offload.margin_s:
            return actions   # nothing measured, or no worker slower than another by the margin
        slowest = bounds[1]
        idle = [self.workers[n] for n in self._in_order(self._with_room)
                if self.workers[n].cls in self.offload.speculate_on]
        mines = [m for m in (self.speeds.estimate(w.name) for w in idle) if m is not None]
        # A twin pays off only where a request's worker is slower than an idle one by more
        # than the margin (it started no later than now); with no such pair, skip the scan.
        if not mines or slowest <= min(mines) + self.offload.margin_s:
            return actions
        # Requests with one running attempt, latest expected end first (ties by name, as
        # ``straggler`` breaks them): computed once, not once per idle worker.
        single = []
        for request in (self.requests[name] for name in self._running):
            if request.state is RequestState.RUNNING and len(request.live) == 1:
                (attempt, on), = request.live.items()
                per = self.speeds.estimate(on)
                if per is not None:
                    single.append((-(request.started[attempt] + per), request.name, on))
        single.sort()
        for worker in idle:
            mine = self.speeds.estimate(worker.name)
            if worker.free <= 0 or mine is None:
                continue
            latest = next((entry for entry in single if entry[2] != worker.name), None)
            if latest is None:
                continue
            chosen = straggler({latest[1]: -latest[0]}, self.now + mine, self.offload.margin_s)
            if chosen is not None:
                single.remove(latest)
                actions.append(self._start(self.requests[chosen], worker))
        return actions

    def _starvation(self) -> list[Action]:
        """Say once when queued requests have no worker left to take them."""
        starved = bool(self.queue) and not self.closed and not any(
            w.state is WorkerState.ACTIVE for w in self.workers.values())
        announce = starved and not self._starved
        self._starved = starved
        if not starved:   # a worker came (or nothing waits): the give-up clock starts over
            self._starved_since = None
        return [Starved(len(self.queue))] if announce else []
