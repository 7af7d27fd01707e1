"""Adaptive offload decisions: measured speeds, earliest-finish planning of the tail, stragglers."""
from __future__ import annotations

import pytest

from spotlight.scheduling.dispatch import (
    Assign,
    AttemptOvertaken,
    Cancel,
    Dispatcher,
    Offload,
    RequestDone,
    RequestPreempted,
    RequestState,
    RequestSubmitted,
    Requeued,
    Tick,
    WorkerJoined,
    WorkerLost,
)
from spotlight.scheduling.offload import SpeedBook, eft_plan, planned_takers, straggler


def test_speeds_are_measured_and_unknown_workers_borrow_their_class_mean():
    book = SpeedBook(weight=0.5)
    for worker, cls in (("gpu-0", "gpu"), ("spot-0", "spot"), ("spot-1", "spot")):
        book.joined(worker, cls)
    assert book.estimate("spot-0") is None            # nothing measured yet
    book.observe("gpu-0", 2.0)
    assert book.estimate("spot-0") == 2.0             # nobody of its class known: everyone's
    book.observe("spot-0", 10.0)
    book.observe("spot-0", 6.0)
    assert book.estimate("spot-0") == 8.0             # moving average
    assert book.estimate("spot-1") == 8.0             # its class's mean
    with pytest.raises(ValueError, match="expected >= 0"):
        book.observe("gpu-0", -1.0)


def test_the_plan_gives_the_tail_to_whoever_finishes_first():
    speeds = {"gpu": 1.0, "spot": 3.0}
    # Plenty of work: both pull, the fast one three times as much.
    assert eft_plan({"gpu": [0.0], "spot": [0.0]}, speeds, 8) == {"gpu": 6, "spot": 2}
    # The last request: the gpu worker, free in 1 s, finishes it at 2 s; the spot worker,
    # free now, would need until 3 s. It waits.
    assert planned_takers(["spot"], {"gpu": [1.0], "spot": [0.0]}, speeds, 1) == []
    # Two left: the spot worker's one ends at 3 s, the gpu worker's second at 3 s as well --
    # the plan takes both workers, so the stage ends at 3 s, not 4.
    assert planned_takers(["spot"], {"gpu": [1.0], "spot": [0.0]}, speeds, 3) == ["spot"]
    assert planned_takers(["gpu", "spot"], {"gpu": [0.0], "spot": [0.0]}, speeds, 1) == ["gpu"]


def test_with_a_speed_unknown_nobody_is_held_back():
    assert planned_takers(["spot"], {"gpu": [1.0], "spot": [0.0]},
                          {"gpu": 1.0, "spot": None}, 1) == ["spot"]


def test_multi_slot_workers_are_planned_per_slot():
    plan = eft_plan({"a": [0.0, 0.0], "b": [0.0]}, {"a": 2.0, "b": 2.0}, 3)
    assert plan == {"a": 2, "b": 1}


def test_a_straggler_is_rerun_only_when_it_clearly_pays():
    running = {"p1": 20.0, "p2": 12.0}
    assert straggler(running, idle_finish=15.0, margin=1.0) == "p1"
    assert straggler(running, idle_finish=19.5, margin=1.0) is None   # not clearly sooner
    assert straggler({}, idle_finish=0.0, margin=0.0) is None


# --- inside the dispatch state machine -----------------------------------------------------------

def assigned(actions):
    return [(a.request, a.worker) for a in actions if isinstance(a, Assign)]


def measured_pair(speculate_on=("gpu",)):
    """A gpu worker measured at 1 s per request, a spot worker at 4 s, both idle at t = 10."""
    d = Dispatcher(offload=Offload(speculate_on=speculate_on, margin_s=0.5))
    d.handle(WorkerJoined("gpu-0", cls="gpu"))
    d.handle(WorkerJoined("spot-0", cls="spot"))
    d.handle(RequestSubmitted("warm-a"))
    d.handle(RequestSubmitted("warm-b"))
    d.handle(Tick(10.0))
    d.handle(RequestDone("warm-a", 1, seconds=1.0))
    d.handle(RequestDone("warm-b", 1, seconds=4.0))
    assert d.speeds.estimate("gpu-0") == 1.0 and d.speeds.estimate("spot-0") == 4.0
    return d


def test_the_last_request_waits_for_the_faster_worker():
    d = measured_pair(speculate_on=())
    d.handle(RequestSubmitted("r0"))   # both idle: the plan gives the one request to the gpu
    assert d.requests["r0"].worker == "gpu-0"
    out = d.handle(RequestSubmitted("r1"))   # gpu busy until 11, would end it at 12; spot at 14
    assert assigned(out) == [] and list(d.queue) == ["r1"]
    d.handle(Tick(11.0))
    out = d.handle(RequestDone("r0", 1, seconds=1.0))
    assert assigned(out) == [("r1", "gpu-0")]


def test_a_long_queue_still_uses_every_worker():
    d = measured_pair(speculate_on=())
    out = []
    for i in range(10):
        out += d.handle(RequestSubmitted(f"r{i}"))
    assert {w for _, w in assigned(out)} == {"gpu-0", "spot-0"}


def test_an_idle_gpu_worker_reruns_a_straggling_spot_request_and_the_first_answer_wins():
    d = Dispatcher(offload=Offload(speculate_on=("gpu",), margin_s=0.5))
    d.handle(WorkerJoined("spot-0", cls="spot"))
    d.handle(RequestSubmitted("warm"))
    d.handle(RequestDone("warm", 1, seconds=8.0))          # spot: 8 s per request
    d.handle(RequestSubmitted("r0"))                        # spot runs it from t = 0, ends ~8
    assert d.requests["r0"].worker == "spot-0"
    d.handle(WorkerJoined("gpu-0", cls="gpu"))
    d.handle(RequestSubmitted("gwarm"))
    d.handle(Tick(1.0))
    out = d.handle(RequestDone("gwarm", 1, seconds=2.0))    # gpu idle at 1, would end r0 at 3
    assert assigned(out) == [("r0", "gpu-0")]
    assert sorted(d.requests["r0"].live.values()) == ["gpu-0", "spot-0"]
    out = d.handle(RequestDone("r0", 2, seconds=2.0))       # the gpu twin answers first
    assert [(c.request, c.worker, c.attempt) for c in out if isinstance(c, Cancel)] == \
        [("r0", "spot-0", 1)]
    assert d.requests["r0"].state is RequestState.DONE and not d.workers["spot-0"].running


def twins() -> Dispatcher:
    """r0 runs on a slow spot worker (attempt 1) and, re-run as a straggler, on an idle gpu
    worker (attempt 2)."""
    d = Dispatcher(offload=Offload(speculate_on=("gpu",), margin_s=0.5))
    d.handle(WorkerJoined("spot-0", cls="spot"))
    d.handle(RequestSubmitted("warm"))
    d.handle(RequestDone("warm", 1, seconds=8.0))
    d.handle(RequestSubmitted("r0"))
    d.handle(WorkerJoined("gpu-0", cls="gpu"))
    d.handle(RequestSubmitted("gwarm"))
    d.handle(RequestDone("gwarm", 1, seconds=2.0))
    return d


def test_losing_one_twin_requeues_nothing_and_losing_both_does():
    d = twins()
    assert len(d.requests["r0"].live) == 2
    out = d.handle(WorkerLost("spot-0"))                    # the spot worker vanishes
    assert not [a for a in out if isinstance(a, Requeued)] and d.requests["r0"].worker == "gpu-0"
    out = d.handle(RequestPreempted("r0", 2, step=3))       # and the twin is handed back
    assert [(r.request, r.step) for r in out if isinstance(r, Requeued)] == [("r0", 3)]
    # Requeued, and at once pulled again by the gpu worker, from its committed step.
    assert [(a.request, a.worker, a.resume_step) for a in out if isinstance(a, Assign)] == \
        [("r0", "gpu-0", 3)]


def test_a_twin_overtaken_in_the_store_stops_without_counting_as_a_preemption():
    d = twins()
    assert sorted(d.requests["r0"].live.values()) == ["gpu-0", "spot-0"]
    out = d.handle(AttemptOvertaken("r0", 2, step=5))   # the gpu twin found spot-0 ahead
    assert not [a for a in out if isinstance(a, Requeued)]
    # The idle gpu worker may take the straggler up again -- from the step the store holds.
    assert [(a.worker, a.attempt, a.resume_step) for a in out if isinstance(a, Assign)] == \
        [("gpu-0", 3, 5)]
    request = d.requests["r0"]
    assert request.live == {1: "spot-0", 3: "gpu-0"} and request.committed_step == 5
    assert request.graceful_preemptions == request.hard_preemptions == 0
    d.handle(WorkerLost("gpu-0"))
    out = d.handle(AttemptOvertaken("r0", 1, step=6))   # then spot-0's is overtaken as well
    assert [(r.request, r.step) for r in out if isinstance(r, Requeued)] == [("r0", 6)]
    assert d.handle(AttemptOvertaken("r0", 1, step=6))[0].reason.endswith("is not running")


def test_without_offload_nothing_is_held_back_or_duplicated():
    d = Dispatcher()
    d.handle(WorkerJoined("gpu-0", cls="gpu"))
    d.handle(WorkerJoined("spot-0", cls="spot"))
    d.handle(RequestSubmitted("a"))
    d.handle(RequestDone("a", 1, seconds=1.0))
    d.handle(RequestSubmitted("b"))
    d.handle(RequestDone("b", 1, seconds=9.0))
    out = d.handle(RequestSubmitted("c"))
    assert len(assigned(out)) == 1 and all(len(r.live) <= 1 for r in d.requests.values())


def test_workers_still_loading_weights_keep_the_stage_from_giving_up():
    from spotlight.scheduling.dispatch import GaveUp

    d = Dispatcher(no_worker_wait_s=10.0)
    d.handle(RequestSubmitted("r0"))
    d.handle(Tick(0.0))
    assert not [a for a in d.handle(Tick(30.0, arriving=1)) if isinstance(a, GaveUp)]
    d.handle(Tick(31.0))   # the newcomer vanished before it was ready: the clock starts over
    assert [a for a in d.handle(Tick(42.0)) if isinstance(a, GaveUp)] == [GaveUp(11.0, 1)]


def _full_plan_takers(d) -> list:
    """The offload decision by the book: plan the whole queue over every active worker's
    every slot (what ``Dispatcher._takers`` must equal, shortcuts and pruning aside)."""
    from spotlight.scheduling.dispatch import WorkerState

    free = [d.workers[n] for n in d._in_order(d._with_room)]
    if d.offload is None or not free or not d.speeds.seconds:
        return free
    active = [w for w in d.workers.values() if w.state is WorkerState.ACTIVE]
    speeds = {w.name: d.speeds.estimate(w.name) for w in active}
    busy = {w.name: [] for w in active}
    for request in d.requests.values():
        for attempt, worker in request.live.items():
            if worker in busy:
                busy[worker].append(max(d.now, request.started[attempt] + speeds[worker]))
    ready = {w.name: sorted(busy[w.name]) + [d.now] * (w.slots - len(busy[w.name]))
             for w in active}
    chosen = set(planned_takers([w.name for w in free], ready, speeds, len(d.queue)))
    return [w for w in free if w.name in chosen]


def _random_stage(seed: int, by_the_book: bool) -> list:
    """A random stage on workers of tied and different speeds whose requests take longer or
    shorter than measured (overdue slots), with workers joining, noticed and killed."""
    import random

    from spotlight.scheduling.dispatch import (
        Dispatcher,
        NoticeReceived,
        Offload,
        RequestDone,
        RequestPreempted,
        RequestSubmitted,
        Tick,
        WorkerJoined,
        WorkerLost,
    )

    rng = random.Random(seed)
    d = Dispatcher(offload=Offload())
    if by_the_book:
        d._takers = lambda: _full_plan_takers(d)
    out, now, took = [], 0.0, {}
    speeds = {f"w{i}": rng.choice([1.0, 1.0, 1.5, 4.0, 9.0]) for i in range(rng.randint(2, 12))}
    late = list(speeds)[rng.randint(1, len(speeds) - 1):]   # these join mid-stage
    for name in speeds:
        if name not in late:
            out += d.handle(WorkerJoined(name, rng.randint(1, 2), rng.choice(["gpu", "spot"])))
    for r in range(rng.randint(5, 60)):
        out += d.handle(RequestSubmitted(f"r{r}"))
    while not d.finished and now < 1e4:
        for request in d.requests.values():
            for attempt, worker in request.live.items():
                took.setdefault((request.name, attempt),
                                speeds[worker] * rng.choice([0.5, 1.0, 1.0, 1.3, 3.0]))
        running = sorted((req.started[a] + took[req.name, a], req.name, a)
                         for req in d.requests.values() for a in req.live)
        if not running:
            break
        end, name, attempt = running[0]
        now = max(now, end)
        out += d.handle(Tick(now))
        worker = d.requests[name].live[attempt]
        event = rng.random()
        if event < 0.05 and late:
            out += d.handle(WorkerJoined(late.pop(), 1, "spot"))
        elif event < 0.08:
            out += d.handle(WorkerLost(worker))
        elif event < 0.11:
            out += d.handle(NoticeReceived(worker))
            out += d.handle(RequestPreempted(name, attempt, 1))
        else:
            out += d.handle(RequestDone(name, attempt, took[name, attempt]))
    return out


def test_the_offload_shortcuts_make_the_same_decisions_as_full_planning():
    """``Dispatcher._takers`` skips planning a long queue and plans only the slots that can
    matter; on random stages it must hand out exactly what planning every slot does."""
    for seed in range(300):
        assert _random_stage(seed, by_the_book=False) == _random_stage(seed, by_the_book=True), \
            seed
