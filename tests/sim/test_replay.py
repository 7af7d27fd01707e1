"""Replaying recorded task durations through the simulator's stages."""
from __future__ import annotations

import pytest

from spotlight.sim.replay import RecordedIteration, replay_iteration, validate_replay


def task(stage, worker, start, end, **extra):
    return {"stage": stage, "worker": worker, "start": start, "end": end, **extra}


VANILLA = (task("rollout", "gpu-0", 100.0, 104.0), task("reward", "gpu-0", 104.0, 104.2),
           task("train", "gpu-0", 104.3, 110.3), task("checkpoint", "gpu-0", 110.3, 110.4))


def test_a_serial_iteration_is_the_sum_of_its_tasks():
    seconds = replay_iteration(RecordedIteration(10.6, False, VANILLA), gpu_workers=1,
                               spot_workers=1)
    assert seconds == pytest.approx(4.0 + 0.2 + 6.0 + 0.1)


def test_stale_exploration_on_the_spot_worker_overlaps_the_critical_path():
    explore = tuple(task("explore", "spot-0", 100.0 + 3 * i, 103.0 + 3 * i) for i in range(5))
    it = RecordedIteration(16.0, False, VANILLA + explore)
    # Without a deadline the iteration waits for the 5 x 3 s of exploration (15 s > 10.3 s).
    assert replay_iteration(it, gpu_workers=1, spot_workers=1, deadline=False) == \
        pytest.approx(15.0)
    # With the deadline exploration stops when training ends.
    assert replay_iteration(it, gpu_workers=1, spot_workers=1, deadline=True) == \
        pytest.approx(10.3)
    # Window "train": exploration starts with training (at 4.2) and runs 15 s past it.
    assert replay_iteration(it, gpu_workers=1, spot_workers=1, window="train",
                            deadline=False) == pytest.approx(4.2 + 15.0)


def test_sync_exploration_is_pulled_by_the_gpu_workers_before_the_rollout():
    sync = tuple(task("explore-sync", "gpu-0", 90.0 + 2 * i, 92.0 + 2 * i) for i in range(4))
    seconds = replay_iteration(RecordedIteration(18.0, False, sync + VANILLA), gpu_workers=1,
                               spot_workers=0)
    assert seconds == pytest.approx(8.0 + 10.3)


def test_validate_skips_the_warm_up_and_validated_iterations():
    # VANILLA's four stages span 10.3 s; 0.5 s more is the driver's, 0.1 s at each of the five
    # boundaries (before, between and after the stages).
    its = [RecordedIteration(30.0, False, VANILLA), RecordedIteration(10.8, False, VANILLA),
           RecordedIteration(50.0, True, VANILLA), RecordedIteration(10.8, False, VANILLA)]
    check = validate_replay(its, gpu_workers=1, spot_workers=0)
    assert check["iterations"] == 2
    assert check["measured_s"] == pytest.approx(10.8)
    assert check["simulated_s"] == pytest.approx(10.8)
    assert check["error"] == pytest.approx(0.0, abs=1e-12)
    assert check["driver_s_per_stage"] == pytest.approx(0.1)
    assert check["error_without_driver"] == pytest.approx(0.5 / 10.8)
    with pytest.raises(ValueError, match="at least 2 are needed"):
        validate_replay(its[:2], gpu_workers=1, spot_workers=0)


def test_each_iteration_is_replayed_with_the_other_iterations_driver_seconds():
    # 0.14 s a boundary in the first, none in the second: each gets the other's, never its own.
    its = [RecordedIteration(30.0, False, VANILLA), RecordedIteration(11.0, False, VANILLA),
           RecordedIteration(10.3, False, VANILLA)]
    check = validate_replay(its, gpu_workers=1, spot_workers=0)
    assert check["per_iteration"] == [[11.0, pytest.approx(10.3)],
                                      [10.3, pytest.approx(11.0)]]
    assert check["error"] == pytest.approx(0.0, abs=1e-12)   # the means agree, not each


def test_a_recorded_event_sequence_replays_to_the_same_assignments():
    from spotlight.sim.replay import replay_decisions

    events = [{"event": "Offload", "offload": None},
              {"event": "WorkerJoined", "worker": "spot-0", "slots": 1, "cls": "spot"},
              {"event": "WorkerJoined", "worker": "spot-1", "slots": 1, "cls": "spot"},
              {"event": "RequestSubmitted", "request": "a"},
              {"event": "RequestSubmitted", "request": "b"},
              {"event": "RequestSubmitted", "request": "c"},
              {"event": "RequestProgressed", "request": "a", "step": 4},
              {"event": "WorkerLost", "worker": "spot-0"},
              {"event": "RequestDone", "request": "b", "attempt": 1, "seconds": 2.0}]
    assert replay_decisions(events) == [
        {"request": "a", "attempt": 1, "worker": "spot-0", "resume_step": 0},
        {"request": "b", "attempt": 1, "worker": "spot-1", "resume_step": 0},
        # spot-0 died with "a" at step 4: it goes back to the front of the queue, and the
        # next free worker resumes it from there before "c".
        {"request": "a", "attempt": 2, "worker": "spot-1", "resume_step": 4},
    ]
    with pytest.raises(ValueError, match="offload setting"):
        replay_decisions(events[1:])


def test_the_spot_worker_pulls_rollout_requests_after_the_stale_tasks_it_ran_first():
    # The spot worker audits until 2.5 s, then pulls one rollout request (2 s); the gpu
    # worker runs the other four (1 s each), the last from 3 s: the rollout ends at 4.5 s.
    rollout = (task("rollout", "gpu-0", 0.0, 1.0), task("rollout", "gpu-0", 1.0, 2.0),
               task("rollout", "gpu-0", 2.0, 3.0), task("rollout", "spot-0", 2.5, 4.5),
               task("rollout", "gpu-0", 3.0, 4.0))
    audit = (task("audit", "spot-0", 0.0, 2.5),)
    seconds = replay_iteration(RecordedIteration(4.5, False, rollout + audit), gpu_workers=1,
                               spot_workers=1)
    assert seconds == pytest.approx(4.5)
    # Had the audit run after the rollout request, the spot worker would pull from the start.
    late = (task("audit", "spot-0", 4.5, 7.0),)
    assert replay_iteration(RecordedIteration(4.5, False, rollout + late), gpu_workers=1,
                            spot_workers=1) < 4.5
