"""Dask glue of pull-based dispatch: observe the cluster, feed the state machine, act.

A :class:`RequestPool` owns one stage's requests (an exploration or an audit). A background
thread in the driver turns what it sees -- spot workers joining and leaving the scheduler,
preemption notices, attempts finishing -- into :mod:`spotlight.scheduling.dispatch` events,
and carries the actions out: an ``Assign`` is one attempt submitted *pinned to that worker*
(``allow_other_workers=False``) under its own key. Two Dask defaults stop mattering that way:
a key dies with at most one worker, so ``allowed-failures`` never turns a preemption into
``KilledWorker``; and the scheduler never sees more spot work than there are free slots, so
it cannot pile resource-restricted tasks onto one worker.
"""
from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from pipelines.cluster import SPOT, ClusterHandle, task_error
from pipelines.cluster.classes import class_of, heard_at, scheduler_workers
from pipelines.cluster.preemption import HandedBack, NoticeInbox
from pipelines.cluster.worker_setup import add_missing_plugins
from spotlight.config import PreemptionConfig
from spotlight.scheduling.dispatch import (
    Assign,
    AttemptOvertaken,
    Cancel,
    Dispatcher,
    GaveUp,
    Ignored,
    NoticeReceived,
    Offload,
    RequestDone,
    RequestPreempted,
    RequestProgressed,
    RequestsSubmitted,
    RequestState,
    Requeued,
    ResultLost,
    Retired,
    StageClosed,
    Starved,
    Tick,
    WorkerJoined,
    WorkerLost,
    WorkerState,
)
from spotlight.scheduling.dispatch_events import event_record
from spotlight.scheduling.liveness import CutOffs, Liveness, ProgressWatch, unheard
from storage import StreamOvertakenError

EventFn = Callable[[str, dict], None]
_POLL_S = 0.1          # how long the loop waits for an attempt to finish before looking around
_WORKERS_EVERY_S = 0.25
_FETCH_TIMEOUT_S = 30.0  # a finished attempt's result is a small record; longer means it is gone
_LIVENESS_EVERY_S = 2.0   # the most often running requests' committed steps are read
# A cut-off worker rejoins once the scheduler heard from it this long after it was cut off
# (clock skew between the scheduler's host and the driver's).
_REJOIN_GRACE_S = 5.0


@dataclass(frozen=True)
class RequestSpec:
    """One request: what to run, and where its latents live in the run store."""

    name: str                 # unique in the pool, e.g. "p0003-c0001"
    fn: Callable
    args: tuple
    stage: str                # run-store stage of its latent stream (iter-K/explore)
    request: str              # its stream name in that stage
    numbered: bool = False    # fn takes ``attempt=(lease epoch, number)``: its fencing token


class RequestPool:
    """Pull-based execution of one stage's requests on the workers of ``resource`` (a worker
    class, or several: a rollout pulled by gpu and spot workers alike, with ``offload``)."""

    def __init__(self, cluster: ClusterHandle, requests: list[RequestSpec],
                 config: PreemptionConfig, *, store=None, resource: str | tuple[str, ...] = SPOT,
                 offload: Offload | None = None, on_event: EventFn | None = None,
                 warm_up: Callable[[str], Any] | None = None, watch_progress: bool = True,
                 cut_off: CutOffs | None = None) -> None:
        self.cluster, self.client, self.config = cluster, cluster.client, config
        self.resources = (resource,) if isinstance(resource, str) else tuple(resource)
        self.store, self.resource = store, "/".join(self.resources)
        self.on_event = on_event or (lambda kind, info: None)
        self.specs = {spec.name: spec for spec in requests}
        if len(self.specs) != len(requests):
            raise ValueError("RequestPool: request names must be unique")
        self.dispatcher = Dispatcher(no_worker_wait_s=config.no_spot_wait_s, offload=offload)
        self.results: dict[str, dict] = {}
        self.log: list[dict] = []          # every move of a request or worker, with its time
        self.events: list[dict] = [offload_record(offload)]   # the dispatcher's stimuli
        self._pending_tick: dict | None = None
        self.error: BaseException | None = None
        self.gave_up: str | None = None    # why the pool stopped before every request finished
        # future -> request, attempt, worker, when it was submitted (monotonic)
        self._attempts: dict[Any, tuple[str, int, str, float]] = {}
        self._by_attempt: dict[tuple[str, int], Any] = {}
        self._addresses: dict[str, str] = {}                   # worker address -> name
        # Workers that join while the pool runs load the weights first (``warm_up(address)``
        # -> a future of a task pinned there) and only then pull: RLBoost's newcomers.
        self._warm_up = warm_up
        self._warming: dict[str, tuple[Any, float]] = {}   # address -> future, seen at
        self._seen_at: dict[str, float] = {}
        self._noticed: set[str] = set()   # noticed before they joined: never given work
        self.newcomer_ready_s: list[float] = []   # joining -> first request, per newcomer
        # Progress is liveness: a worker whose requests stop committing is cut off (a partition),
        # long before Dask's worker TTL would drop it; it gets no more work from this pool.
        # (``watch_progress``: the requests commit their steps to ``store`` as they go.)
        self._watch = ProgressWatch(liveness_of(config)) if watch_progress and \
            store is not None and config.liveness_steps > 0 else None
        self._cut_off = CutOffs() if cut_off is None else cut_off   # shared by the run
        self._starting = True
        self._inbox = NoticeInbox.of(self.client)
        self._seen_notices = len(self._inbox.notices)
        self._stop = threading.Event()
        self._ended: queue.Queue = queue.Queue()   # attempts' futures, as they end
        self._finished = threading.Event()
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="spotlight-dispatch", daemon=True)
        # Workers first: queueing requests before the pool has seen any worker would announce
        # "no spot worker left" while every spot worker is alive.
        self._sync_workers()
        self._starting = False
        self._apply(self._handle(RequestsSubmitted(tuple(self.specs))))
        self._thread.start()

    def __len__(self) -> int:
        return len(self.specs)

    # -- the caller's side -----------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until every request finished (or the pool gave up); False on timeout."""
        ok = self._finished.wait(timeout)
        if self.error is not None:
            raise self.error
        return ok

    def close(self) -> dict[str, dict]:
        """Stop: cancel what still runs or waits; the results of the finished requests."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._apply(self._handle(StageClosed()))
        if self.error is not None:
            raise self.error
        return dict(self.results)

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def summary(self) -> dict:
        """Per-request preemptions and attempts, for the stage record and the benchmarks."""
        reqs = self.dispatcher.requests.values()
        return {"requests": len(self.specs), "finished": len(self.results),
                "cancelled": self.dispatcher.count(RequestState.CANCELLED),
                "preemptions_hard": sum(r.hard_preemptions for r in reqs),
                "preemptions_graceful": sum(r.graceful_preemptions for r in reqs),
                "max_preemptions_of_one_request": max((r.preemptions for r in reqs), default=0),
                "attempts": sum(r.attempt for r in reqs),
                "newcomer_ready_s": list(self.newcomer_ready_s),
                "assigned_per_worker": {w.name: w.assigned
                                        for w in self.dispatcher.workers.values()},
                "gave_up": self.gave_up}

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        next_look = next_liveness = 0.0
        try:
            while not self._stop.is_set() and not self.dispatcher.finished:
                now = time.monotonic()
                if now >= next_look:
                    with self._lock:
                        self._sync_workers()
                        self._read_notices()
                    next_look = now + _WORKERS_EVERY_S
                if self._watch is not None and now >= next_liveness:
                    with self._lock:
                        self._check_liveness(now)
                    next_liveness = now + self._watch.look_every_s(_LIVENESS_EVERY_S)
                done = self._finished_attempts()
                with self._lock:
                    for future in done:
                        self._settle(future)
                    self._apply(self._tick(Tick(time.monotonic(),
                                                arriving=len(self._warming))))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = exc
        finally:
            self._finished.set()

    def _finished_attempts(self) -> list:
        """Attempts that ended since the last look, waiting up to a poll for the first. Each
        attempt's future puts itself here when it ends: a wait on every running future each
        poll would cost the driver in proportion to the workers."""
        try:
            done = [self._ended.get(timeout=_POLL_S)]
        except queue.Empty:
            return []
        while not self._ended.empty():
            done.append(self._ended.get_nowait())
        return done

    def _sync_workers(self) -> None:
        workers = scheduler_workers(self.client)
        self._check_heartbeats(workers)
        for addr in sorted(set(self._cut_off.at) & set(workers)):   # a partition healed
            if self._cut_off.may_rejoin(addr, workers[addr].get("last_seen", 0.0), _REJOIN_GRACE_S):
                name = str(workers[addr].get("name", addr))
                self._note("rejoined", worker=name,   # with the plugins it missed while away
                           plugins_added=add_missing_plugins(self.client, addr))
                self.on_event("dispatch", {"what": "rejoined", "worker": name})
        now = {addr: info for addr, info in workers.items()
               if class_of(info.get("resources", {}), self.resources) is not None
               and info.get("status", "running") == "running" and addr not in self._cut_off}
        for addr in sorted(set(self._addresses) - set(now)):
            self._lose(addr)
        known = set(self._addresses) | set(self._warming) | self._noticed
        for addr in sorted(set(now) - known):
            if self._warm_up is not None and not self._starting:
                self._warming[addr] = (self._warm_up(addr), time.monotonic())
                self._note("warming_up", worker=str(now[addr].get("name", addr)))
                continue
            self._join(addr, now[addr])
        for addr, (future, seen) in list(self._warming.items()):
            if addr not in now:
                del self._warming[addr]
                future.cancel()
            elif future.done():
                del self._warming[addr]
                if future.status == "error":
                    raise task_error(future.exception(), "a newcomer's weights", self.resource)
                self._seen_at[addr] = seen
                self._join(addr, now[addr])

    def _join(self, addr: str, info: dict) -> None:
        self._addresses[addr] = str(info.get("name", addr))
        cls = class_of(info.get("resources", {}), self.resources)
        slots = int(info["resources"][cls])
        self._apply(self._handle(WorkerJoined(addr, slots=max(1, slots), cls=cls)))

    def _lose(self, addr: str) -> None:
        """A spot worker is gone: its attempts are requeued (hard) and forgotten."""
        # What it finished before it left is settled first: a request it handed back after a
        # notice, then retired, is a graceful preemption, not a hard one (seen under load,
        # when the pool looked at the workers before at the finished futures).
        for future, (_, _, worker, _) in list(self._attempts.items()):
            if worker == addr and future.status == "finished":
                self._settle(future)
        if addr not in self._addresses:   # settling found the result gone with its worker
            return
        self._note("worker_lost", worker=self._addresses[addr])
        self._report_progress(addr)
        self._drop_attempts_on(addr)
        self._apply(self._handle(WorkerLost(addr)))
        del self._addresses[addr]

    def _check_heartbeats(self, workers: dict[str, dict]) -> None:
        """A worker of this pool the scheduler has not heard from for
        ``heartbeat_silence_s`` is cut off (a partition), whatever its step time."""
        limit = self.config.heartbeat_silence_s
        if not limit:
            return
        for addr, quiet in unheard(heard_at(workers), self._addresses, limit).items():
            self._cut(addr, quiet, "heartbeat", limit)

    def _check_liveness(self, now: float) -> None:
        """Read the committed step of every running request; a worker whose requests went
        silent past the deadline is treated as lost (its requests resume elsewhere)."""
        for request in list(self._watch.running):
            state = self.dispatcher.requests[request]
            if state.state is not RequestState.RUNNING:
                self._watch.ended(request)
            else:
                self._watch.progressed(request, self._committed(request)[0], now)
        for addr, quiet in sorted(self._watch.silent(now).items()):
            self._cut(addr, quiet, "progress", self._watch.deadline_s())

    def _cut(self, addr: str, quiet: float, by: str, deadline: float) -> None:
        """``addr`` went silent (``by`` its heartbeats or its requests' progress): cut off, and
        lost to this pool -- its requests resume elsewhere."""
        if self._watch is not None:
            self._watch.forget_worker(addr)
        if addr not in self._addresses:
            return
        self._note("silent", worker=self._addresses[addr], silent_s=round(quiet, 1),
                   deadline_s=round(deadline, 1), by=by)
        self.on_event("dispatch", {"what": "silent", "worker": self._addresses[addr],
                                   "silent_s": quiet, "by": by})
        self._cut_off.cut(addr, time.time())
        self._lose(addr)

    def _report_progress(self, addr: str) -> None:
        """Tell the dispatcher how far the requests of ``addr`` got (their committed step in the
        run store), so their next attempts resume from there."""
        state = self.dispatcher.workers.get(addr)
        for request in sorted(state.running if state is not None else ()):
            self._apply(self._handle(RequestProgressed(request, self._committed(request)[0])))

    def _drop_attempts_on(self, addr: str) -> None:
        """Forget the attempts pinned to a vanished worker: they can never finish (no other
        worker may run them), and a result they left there went with the worker."""
        for future, (request, attempt, worker, _) in list(self._attempts.items()):
            if worker == addr:
                del self._attempts[future]
                self._by_attempt.pop((request, attempt), None)
                future.cancel()

    def _read_notices(self) -> None:
        fresh = self._inbox.notices[self._seen_notices:]
        self._seen_notices += len(fresh)
        for notice in fresh:
            self._note("notice", worker=notice.get("name"), source=notice.get("source"))
            warming = self._warming.pop(notice["worker"], None)
            if warming is not None:   # noticed while loading weights: it never joins
                warming[0].cancel()
                self._noticed.add(notice["worker"])
                continue
            self._apply(self._handle(NoticeReceived(notice["worker"],
                                                    notice.get("source", ""))))

    def _settle(self, future) -> None:
        entry = self._attempts.pop(future, None)
        if entry is None:
            return   # cancelled meanwhile (superseded, or its worker was lost)
        request, attempt, worker, submitted = entry
        self._by_attempt.pop((request, attempt), None)
        if future.status == "cancelled":
            return
        if future.status == "error":
            if self.dispatcher.requests[request].state is RequestState.DONE:
                return   # a superseded attempt failed: its request already has its answer
            if isinstance(future.exception(), StreamOvertakenError):
                step = self._committed(request)[0]
                self._note("overtaken", request=request, attempt=attempt,
                           worker=self._addresses.get(worker, worker), step=step)
                self._apply(self._handle(AttemptOvertaken(request, attempt, step)))
                return
            # a bug in the request is an error, not a preemption
            raise task_error(future.exception(), f"{self.specs[request].stage} request "
                                                 f"{request}", self.resource)
        try:
            # A result whose worker died before the gather is never coming back: the scheduler
            # would recompute the pinned key and wait for its dead worker for ever.
            out = future.result(timeout=_FETCH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the worker went with the result
            future.cancel()
            self._note("fetch_failed", request=request, error=f"{type(exc).__name__}: {exc}")
            alive = worker not in self._addresses or \
                worker in scheduler_workers(self.client)
            if not alive:   # bookkeeping of the glue; what it means is the dispatcher's call
                self._note("worker_lost", worker=self._addresses[worker])
                self._report_progress(worker)
                self._drop_attempts_on(worker)
                del self._addresses[worker]
            self._apply(self._handle(
                ResultLost(request, attempt, worker, alive, self._committed(request)[0])))
            return
        if isinstance(out, HandedBack):
            # A hand-back says its worker heard a notice, maybe before its notice event
            # arrives here: drain it first, or the request would be handed straight back to it.
            state = self.dispatcher.workers.get(worker)
            if state is not None and state.state is WorkerState.ACTIVE:
                self._apply(self._handle(NoticeReceived(worker, "hand-back")))
            self._note("handed_back", request=request, attempt=attempt,
                       worker=self._addresses.get(worker, worker), step=out.step,
                       computed_step=out.computed_step)
            self._apply(self._handle(RequestPreempted(request, attempt, out.step)))
            return
        self.results.setdefault(request, out)
        self._apply(self._handle(RequestDone(request, attempt,
                                             time.monotonic() - submitted)))

    # -- the dispatcher's stimuli ---------------------------------------------------------
    def _handle(self, event) -> list:
        """Hand ``event`` to the dispatcher and record it (workers by name), so that the same
        event sequence can be replayed to the same decisions (``spotlight.sim.replay``)."""
        if self._pending_tick is not None:   # time had passed: the dispatcher saw it first
            self.events.append(self._pending_tick)
            self._pending_tick = None
        self.events.append(event_record(event, self._addresses))
        return self.dispatcher.handle(event)

    def _tick(self, tick: Tick) -> list:
        """Ticks come every poll; one is recorded when it decides something, or as the last
        tick before the next recorded event (what the dispatcher's clock read then)."""
        actions = self.dispatcher.handle(tick)
        record = event_record(tick, self._addresses)
        if actions:
            self.events.append(record)
            self._pending_tick = None
        else:
            self._pending_tick = record
        return actions

    # -- actions ---------------------------------------------------------------------------
    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Assign):
                self._assign(action)
            elif isinstance(action, Cancel):
                future = self._by_attempt.pop((action.request, action.attempt), None)
                if future is not None:
                    self._attempts.pop(future, None)
                    future.cancel()
            elif isinstance(action, Requeued):
                committed_at = self._committed(action.request)[1]
                self._note("requeued", request=action.request,
                           worker=self._addresses.get(action.worker, action.worker),
                           step=action.step, committed_at=committed_at, hard=action.hard)
            elif isinstance(action, Retired):
                self._note("retired", worker=self._addresses.get(action.worker, action.worker))
            elif isinstance(action, Starved):
                self._note("starved", waiting=action.waiting)
                self.on_event("dispatch", {"what": "starved", "waiting": action.waiting,
                                           "wait_s": self.config.no_spot_wait_s})
            elif isinstance(action, GaveUp):
                self.gave_up = (f"no {self.resource} worker for {self.config.no_spot_wait_s:g} s; "
                                f"{action.waiting} requests not run")
                self._note("gave_up", reason=self.gave_up)
                self.on_event("dispatch", {"what": "gave_up", "reason": self.gave_up})
            elif isinstance(action, Ignored):
                self._note("ignored", reason=action.reason)

    def _assign(self, action: Assign) -> None:
        spec = self.specs[action.request]
        # Each attempt is told its number: its fencing token in the run store.
        numbered = {"attempt": (0 if self.store is None else self.store.epoch,
                                action.attempt)} if spec.numbered else {}
        future = self.client.submit(
            spec.fn, *spec.args, **numbered, workers=[action.worker],
            allow_other_workers=False, pure=False,
            key=f"{spec.stage.replace('/', '-')}-{spec.name}-a{action.attempt}-"
                f"{uuid.uuid4().hex[:6]}")
        self._attempts[future] = (action.request, action.attempt, action.worker, time.monotonic())
        future.add_done_callback(self._ended.put)
        seen = self._seen_at.pop(action.worker, None)
        if seen is not None:   # a newcomer's first request: how long joining took
            self.newcomer_ready_s.append(time.monotonic() - seen)
        self._by_attempt[(action.request, action.attempt)] = future
        if self._watch is not None:
            self._watch.started(action.request, action.worker, action.resume_step,
                                time.monotonic())
        self._note("assigned", request=action.request, attempt=action.attempt,
                   worker=self._addresses.get(action.worker, action.worker),
                   resume_step=action.resume_step)

    def _committed(self, request: str) -> tuple[int, float | None]:
        """The request's committed step in the run store and when it was committed."""
        spec = self.specs[request]
        if self.store is None:
            return self.dispatcher.requests[request].committed_step, None
        record = self.store.latents.commit_record(spec.stage, spec.request)
        if record is None:
            return 0, None
        # -1: an attempt claimed the request and has committed no step yet
        return max(int(record["step"]), 0), record.get("updated_at")

    def _note(self, kind: str, **info: Any) -> None:
        self.log.append({"kind": kind, "at": time.time(), **info})


def liveness_of(config: PreemptionConfig) -> Liveness:
    return Liveness(factor=config.liveness_steps, floor_s=config.liveness_floor_s,
                    cold_s=max(config.liveness_first_s, config.liveness_floor_s))


def offload_record(offload: Offload | None) -> dict:
    return {"event": "Offload", "offload": None if offload is None else
            {"speculate_on": list(offload.speculate_on), "margin_s": offload.margin_s}}
