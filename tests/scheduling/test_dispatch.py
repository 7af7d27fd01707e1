"""The pull-dispatch state machine, driven by events alone (no Dask)."""
import random

import pytest

from spotlight.scheduling.dispatch import (
    Assign,
    Cancel,
    Dispatcher,
    GaveUp,
    Ignored,
    NoticeReceived,
    RequestDone,
    RequestPreempted,
    RequestProgressed,
    RequestState,
    RequestSubmitted,
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


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def submit(d, names):
    out = []
    for name in names:
        out += d.handle(RequestSubmitted(name))
    return out


def test_a_worker_holds_at_most_its_slots_and_pulls_the_next_when_one_frees():
    d = Dispatcher()
    submit(d, ["r0", "r1", "r2", "r3"])
    first = d.handle(WorkerJoined("w", slots=2))
    assert [(a.request, a.worker) for a in of(first, Assign)] == [("r0", "w"), ("r1", "w")]
    assert list(d.queue) == ["r2", "r3"]
    nxt = d.handle(RequestDone("r0", attempt=1))
    assert [(a.request, a.attempt, a.resume_step) for a in of(nxt, Assign)] == [("r2", 1, 0)]
    assert d.requests["r0"].state is RequestState.DONE and len(d.workers["w"].running) == 2


def test_fast_and_slow_workers_balance_by_pulling():
    d = Dispatcher()
    submit(d, [f"r{i}" for i in range(12)])
    d.handle(WorkerJoined("fast"))
    d.handle(WorkerJoined("slow"))
    # The fast worker finishes three requests in the time the slow one finishes one.
    clock = {"fast": 0.0, "slow": 0.0}
    speed = {"fast": 1.0, "slow": 3.0}
    while not d.finished:
        worker = min((w for w in clock if d.workers[w].running), key=lambda w: clock[w] + speed[w])
        clock[worker] += speed[worker]
        request = next(iter(d.workers[worker].running))
        d.handle(RequestDone(request, d.requests[request].attempt))
    assert d.workers["fast"].assigned == 9 and d.workers["slow"].assigned == 3
    assert max(clock.values()) == 9.0   # push dispatch (6 + 6) would end at 18


def test_hard_loss_requeues_in_flight_requests_at_the_front_with_their_committed_step():
    d = Dispatcher()
    submit(d, ["a", "b", "c"])
    d.handle(WorkerJoined("w1"))
    d.handle(RequestProgressed("a", 4))
    actions = d.handle(WorkerLost("w1"))
    assert of(actions, Requeued) == [Requeued("a", "w1", 4, hard=True)]
    assert list(d.queue) == ["a", "b", "c"] and d.workers["w1"].state is WorkerState.GONE
    assert of(actions, Starved) == [Starved(3)]
    assign = of(d.handle(WorkerJoined("w2")), Assign)
    assert assign == [Assign("a", "w2", 2, 4)]
    assert d.requests["a"].hard_preemptions == 1


def test_a_notice_drains_the_worker_and_a_graceful_handback_resumes_elsewhere():
    d = Dispatcher()
    submit(d, ["a", "b"])
    d.handle(WorkerJoined("spot-0"))
    d.handle(WorkerJoined("spot-1"))
    assert d.handle(NoticeReceived("spot-0", "sigterm")) == []
    assert d.workers["spot-0"].state is WorkerState.DRAINING
    # spot-1 finishes b; nothing new goes to the draining spot-0.
    assert of(d.handle(RequestDone("b", 1)), Assign) == []
    actions = d.handle(RequestPreempted("a", attempt=1, step=6))
    assert Requeued("a", "spot-0", 6, hard=False) in actions
    assert Retired("spot-0") in actions
    assert Assign("a", "spot-1", 2, 6) in actions
    assert d.requests["a"].graceful_preemptions == 1 and d.requests["a"].hard_preemptions == 0


def test_a_notice_to_an_idle_worker_retires_it_at_once():
    d = Dispatcher()
    d.handle(WorkerJoined("w"))
    assert d.handle(NoticeReceived("w")) == [Retired("w")]
    assert d.workers["w"].state is WorkerState.GONE


def test_a_notice_for_an_unknown_worker_is_ignored_and_says_so():
    d = Dispatcher()
    d.handle(WorkerJoined("spot-0"))
    (ignored,) = d.handle(NoticeReceived("spot-9"))
    assert isinstance(ignored, Ignored) and "unknown worker 'spot-9'" in ignored.reason
    assert "spot-0" in ignored.reason and d.workers["spot-0"].state is WorkerState.ACTIVE


def test_a_late_answer_of_an_earlier_attempt_wins_and_cancels_the_current_one():
    d = Dispatcher()
    submit(d, ["a"])
    d.handle(WorkerJoined("w1"))
    d.handle(WorkerLost("w1"))
    d.handle(WorkerJoined("w2"))
    actions = d.handle(RequestDone("a", attempt=1))
    assert actions == [Cancel("a", "w2", 2)]
    assert d.requests["a"].state is RequestState.DONE and not d.workers["w2"].running
    assert isinstance(d.handle(RequestDone("a", attempt=2))[0], Ignored)


def test_one_request_preempted_many_times_still_completes():
    d = Dispatcher()
    submit(d, ["r"])
    step = 0
    for i in range(7):
        d.handle(WorkerJoined(f"w{i}"))
        step += 1
        d.handle(RequestProgressed("r", step))
        if i % 2:
            d.handle(WorkerLost(f"w{i}"))
        else:
            d.handle(NoticeReceived(f"w{i}"))
            d.handle(RequestPreempted("r", d.requests["r"].attempt, step))
    d.handle(WorkerJoined("last"))
    assert d.requests["r"].worker == "last" and d.requests["r"].committed_step == 7
    d.handle(RequestDone("r", d.requests["r"].attempt))
    assert d.finished and d.requests["r"].preemptions == 7 and d.requests["r"].attempt == 8


def test_closing_the_stage_cancels_running_and_queued_requests():
    d = Dispatcher()
    submit(d, ["a", "b", "c"])
    d.handle(WorkerJoined("w"))
    actions = d.handle(StageClosed())
    assert actions == [Cancel("a", "w", 1)]
    assert d.count(RequestState.CANCELLED) == 3 and d.finished and not d.queue
    assert of(d.handle(WorkerJoined("w2")), Assign) == []
    with pytest.raises(RuntimeError, match="after the stage closed"):
        d.handle(RequestSubmitted("d"))


def test_starvation_is_announced_once_and_clears_when_a_worker_comes():
    d = Dispatcher()
    assert submit(d, ["a", "b"]) == [Starved(1)]
    assert d.handle(RequestProgressed("a", 1)) == []          # still starved: not repeated
    assert of(d.handle(WorkerJoined("w")), Starved) == []
    assert Starved(2) in d.handle(WorkerLost("w"))            # starved again: said again


def test_bad_events_are_rejected_with_a_clear_message():
    d = Dispatcher()
    with pytest.raises(ValueError, match="0 slots"):
        d.handle(WorkerJoined("w", slots=0))
    d.handle(RequestSubmitted("a"))
    with pytest.raises(ValueError, match="submitted twice"):
        d.handle(RequestSubmitted("a"))
    with pytest.raises(TypeError, match="not a dispatch event"):
        d.handle("worker joined")


@pytest.mark.parametrize("seed", range(5))
def test_random_event_storms_lose_no_request(seed):
    """Whatever order workers come, go and get notices in, every request finishes exactly once."""
    rng = random.Random(seed)
    d = Dispatcher()
    submit(d, [f"r{i}" for i in range(30)])
    names = 0
    for _ in range(3):
        d.handle(WorkerJoined(f"w{names}", slots=rng.choice([1, 2])))
        names += 1
    done = set()
    for _ in range(2000):
        if d.finished:
            break
        running = [r for r in d.requests.values() if r.state is RequestState.RUNNING]
        roll = rng.random()
        if roll < 0.55 and running:
            r = rng.choice(running)
            d.handle(RequestDone(r.name, r.attempt))
            done.add(r.name)
        elif roll < 0.65 and running:
            r = rng.choice(running)
            d.handle(RequestProgressed(r.name, r.committed_step + 1))
        elif roll < 0.75 and d.active_workers():
            d.handle(WorkerLost(rng.choice(d.active_workers())))
        elif roll < 0.82 and d.active_workers():
            d.handle(NoticeReceived(rng.choice(d.active_workers())))
        elif roll < 0.9:
            draining = [r for r in running
                        if d.workers[r.worker].state is WorkerState.DRAINING]
            if draining:
                r = rng.choice(draining)
                d.handle(RequestPreempted(r.name, r.attempt, r.committed_step))
        else:
            d.handle(WorkerJoined(f"w{names}", slots=rng.choice([1, 2])))
            names += 1
        for w in d.workers.values():
            assert len(w.running) <= w.slots
            assert w.state is WorkerState.ACTIVE or w.state is WorkerState.DRAINING or not w.running
    while not d.finished:   # a last worker drains whatever is left
        d.handle(WorkerJoined(f"w{names}", slots=2))
        names += 1
        for r in [r for r in d.requests.values() if r.state is RequestState.RUNNING]:
            d.handle(RequestDone(r.name, r.attempt))
    assert d.count(RequestState.DONE) == 30


def test_a_lost_worker_with_several_slots_requeues_every_request_it_held():
    d = Dispatcher()
    submit(d, ["a", "b", "c", "d"])
    d.handle(WorkerJoined("big", slots=3))
    d.handle(RequestProgressed("a", 2))
    d.handle(RequestProgressed("c", 5))
    actions = d.handle(WorkerLost("big"))
    assert sorted((r.request, r.step) for r in of(actions, Requeued)) == [("a", 2), ("b", 0),
                                                                          ("c", 5)]
    assert sorted(d.queue) == ["a", "b", "c", "d"]
    assert all(d.requests[r].state is RequestState.QUEUED for r in "abcd")
    assigned = of(d.handle(WorkerJoined("next", slots=4)), Assign)
    assert sorted((a.request, a.resume_step) for a in assigned) == [("a", 2), ("b", 0), ("c", 5),
                                                                    ("d", 0)]


def test_starved_requests_are_given_up_after_the_wait_on_the_tick_clock():
    d = Dispatcher(no_worker_wait_s=10.0)
    submit(d, ["a", "b"])
    assert d.handle(Tick(100.0)) == []            # starvation starts now
    assert d.handle(Tick(109.9)) == []
    d.handle(WorkerJoined("w"))                    # a worker comes: the clock resets ...
    d.handle(WorkerLost("w"))                      # ... and goes
    assert d.handle(Tick(115.0)) == []             # starved again, since 115
    actions = d.handle(Tick(125.0))
    assert of(actions, GaveUp) == [GaveUp(10.0, 2)]
    assert d.finished and d.count(RequestState.CANCELLED) == 2 and d.closed
    assert d.handle(Tick(200.0)) == []             # said once


def test_without_a_wait_starvation_never_gives_up():
    d = Dispatcher()
    submit(d, ["a"])
    assert d.handle(Tick(0.0)) == [] and d.handle(Tick(1e9)) == []
    assert not d.finished


def test_a_lost_result_of_a_live_worker_reruns_that_request_from_its_committed_step():
    d = Dispatcher()
    submit(d, ["a", "b"])
    d.handle(WorkerJoined("w", slots=2))
    actions = d.handle(ResultLost("a", 1, "w", worker_alive=True, step=3))
    assert of(actions, Requeued) == [Requeued("a", "w", 3, hard=True)]
    assert of(actions, Assign) == [Assign("a", "w", 2, 3)]   # the free slot pulls it again
    assert d.requests["a"].hard_preemptions == 1 and d.workers["w"].state is WorkerState.ACTIVE
    assert of(d.handle(ResultLost("a", 1, "w", True)), Ignored)   # a stale attempt


def test_a_lost_result_of_a_dead_worker_loses_everything_it_held():
    d = Dispatcher()
    submit(d, ["a", "b", "c"])
    d.handle(WorkerJoined("w", slots=2))
    d.handle(RequestProgressed("b", 4))
    actions = d.handle(ResultLost("a", 1, "w", worker_alive=False, step=2))
    assert sorted((r.request, r.step) for r in of(actions, Requeued)) == [("a", 2), ("b", 4)]
    assert d.workers["w"].state is WorkerState.GONE and of(actions, Starved)


def test_a_lost_worker_s_requests_go_back_to_the_front_in_their_order_and_once():
    d = Dispatcher()
    submit(d, ["a", "b", "c", "d", "e"])
    d.handle(WorkerJoined("big", slots=3))      # holds a, b, c; d and e wait
    actions = d.handle(WorkerLost("big"))
    assert [r.request for r in of(actions, Requeued)] == ["a", "b", "c"]
    assert list(d.queue) == ["a", "b", "c", "d", "e"]   # oldest first, ahead of the waiting
    again = d.handle(WorkerLost("big"))
    assert again == [Ignored(WorkerLost("big"), "worker 'big' was not active")]
    d.handle(WorkerJoined("small", slots=1))
    assert [a.request for a in of(d.handle(WorkerJoined("other", slots=2)), Assign)] == \
        ["b", "c"]   # the queue's order survives the loss: 'small' took 'a'


def test_a_late_hand_back_is_ignored_but_its_committed_step_is_kept():
    d = Dispatcher()
    submit(d, ["a"])
    d.handle(WorkerJoined("w1"))
    d.handle(WorkerLost("w1"))                  # attempt 1 given up on
    d.handle(WorkerJoined("w2"))                # attempt 2 runs on w2
    late = RequestPreempted("a", attempt=1, step=6)   # attempt 1 had committed 6 steps after all
    assert d.handle(late) == [Ignored(late, "attempt 1 of a is not running")]
    assert d.requests["a"].committed_step == 6
    d.handle(WorkerLost("w2"))
    assert of(d.handle(WorkerJoined("w3")), Assign) == [Assign("a", "w3", 3, 6)]
    unknown = RequestPreempted("zz", attempt=1, step=1)
    assert d.handle(unknown) == [Ignored(unknown, "unknown request 'zz'")]
