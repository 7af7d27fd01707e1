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
    its = [RecordedIteration(30.0, False, VANILLA), RecordedIteration(11.0, False, VANILLA),
           RecordedIteration(50.0, True, VANILLA), RecordedIteration(9.6, False, VANILLA)]
    check = validate_replay(its, gpu_workers=1, spot_workers=0)
    assert check["iterations"] == 2
    assert check["measured_s"] == pytest.approx(10.3)
    assert check["simulated_s"] == pytest.approx(10.3)
    assert check["error"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="no iteration without validation"):
        validate_replay(its[:1], gpu_workers=1, spot_workers=0)


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
