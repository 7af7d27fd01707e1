"""Liveness from progress, on a hand-driven clock: silence past the deadline names the worker."""
from __future__ import annotations

import pytest

from spotlight.scheduling.liveness import (
    CutOffs,
    Liveness,
    ProgressWatch,
    SilenceReports,
    unheard,
)


def test_before_any_step_is_measured_the_cold_deadline_applies():
    watch = ProgressWatch(Liveness(factor=10, floor_s=5, cold_s=60))
    watch.started("r1", "w1", step=0, now=0.0)
    assert watch.deadline_s() == 60
    assert watch.silent(59.0) == {} and watch.silent(61.0) == {"w1": 61.0}


def test_the_deadline_follows_the_measured_step_time_but_not_below_the_floor():
    watch = ProgressWatch(Liveness(factor=10, floor_s=5, cold_s=60))
    watch.started("r1", "w1", step=0, now=0.0)
    watch.progressed("r1", 4, now=8.0)          # 2 s per step
    assert watch.deadline_s() == 20.0
    watch.progressed("r1", 4, now=9.0)          # the same step again: no new measurement
    assert watch.deadline_s() == 20.0
    assert watch.silent(27.9) == {} and watch.silent(28.1) == {"w1": pytest.approx(20.1)}
    fast = ProgressWatch(Liveness(factor=10, floor_s=5, cold_s=60))
    fast.started("r", "w", 0, 0.0)
    fast.progressed("r", 10, 1.0)               # 0.1 s per step: 10 x 0.1 = 1 s < floor
    assert fast.deadline_s() == 5


def test_a_committing_request_stays_alive_and_only_the_silent_worker_is_named():
    watch = ProgressWatch(Liveness(factor=5, floor_s=1, cold_s=30))
    watch.started("a", "w1", 0, 0.0)
    watch.started("b", "w2", 3, 0.0)            # resumed from step 3
    for t in range(1, 40):
        watch.progressed("a", t, float(t))      # w1 commits every second
    assert watch.deadline_s() == 5.0
    assert watch.silent(29.5) == {}             # a first step may load weights: cold_s for it
    assert watch.silent(39.5) == {"w2": 39.5}   # w2 never committed past its resume point
    assert watch.forget_worker("w2") == ["b"]
    assert watch.silent(39.5) == {}
    watch.ended("a")
    assert watch.silent(1000.0) == {}


def test_after_its_first_step_a_request_gets_the_measured_deadline():
    watch = ProgressWatch(Liveness(factor=5, floor_s=1, cold_s=100))
    watch.started("a", "w1", 0, 0.0)
    watch.progressed("a", 1, 50.0)              # a slow first step (weights), then
    watch.progressed("a", 2, 51.0)              # one second per step
    assert watch.deadline_s() == pytest.approx(5 * 25.5)   # median of 50 and 1 s
    watch.progressed("a", 3, 52.0)
    assert watch.deadline_s() == 5.0
    assert watch.silent(56.5) == {} and watch.silent(57.5) == {"w1": 5.5}


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="factor > 1"):
        Liveness(factor=1)
    with pytest.raises(ValueError, match="floor_s <= cold_s"):
        Liveness(floor_s=100, cold_s=10)


def test_the_config_refuses_a_deadline_of_one_step_or_less():
    from spotlight.config import ConfigError, PreemptionConfig

    with pytest.raises(ConfigError, match=r"preemption.liveness_steps = 0.5: use 0 \(off\)"):
        PreemptionConfig(liveness_steps=0.5)
    assert PreemptionConfig(liveness_steps=0).liveness_steps == 0


def test_a_cut_off_worker_rejoins_once_the_scheduler_hears_from_it_and_only_once():
    cut = CutOffs()
    cut.cut("w1", now=100.0)
    assert "w1" in cut and "w2" not in cut
    # Heard from before it was cut off (the partition's last heartbeat), or within the grace.
    assert not cut.may_rejoin("w1", last_seen=90.0, grace_s=5.0)
    assert not cut.may_rejoin("w1", last_seen=104.0, grace_s=5.0) and "w1" in cut
    assert cut.may_rejoin("w1", last_seen=106.0, grace_s=5.0) and "w1" not in cut
    # Cut off again after its rejoin: it stays out, whatever the scheduler hears.
    cut.cut("w1", now=200.0)
    assert not cut.may_rejoin("w1", last_seen=300.0, grace_s=5.0) and "w1" in cut
    assert not cut.may_rejoin("never-cut", last_seen=300.0, grace_s=5.0)


def test_a_worker_unheard_past_the_limit_is_named_against_the_freshest_heartbeat():
    """Silence counts from the freshest heartbeat the scheduler holds, not this host's clock
    (the scheduler's clock may be minutes off ours): only the watched workers are named."""
    last_seen = {"w1": 5000.0, "w2": 4980.5, "w3": 4970.0, "gpu": 4999.5}
    assert unheard(last_seen, ["w1", "w2", "w3"], 20.0) == {"w3": 30.0}
    assert unheard(last_seen, ["w1", "w2"], 20.0) == {}
    assert unheard(last_seen, ["w3", "gone"], 35.0) == {}   # a worker Dask removed: not ours
    assert unheard({}, ["w1"], 20.0) == {}


def test_committed_steps_are_read_a_sixth_of_the_deadline_apart_and_never_more_often_than_asked():
    watch = ProgressWatch(Liveness(factor=20, floor_s=60, cold_s=120))
    assert watch.look_every_s(2.0) == 20.0          # before any step: the cold deadline's sixth
    watch.started("r", "w", 0, 0.0)
    watch.progressed("r", 10, 5.0)                  # 0.5 s steps: the 60 s floor holds
    assert watch.look_every_s(2.0) == 10.0
    tight = ProgressWatch(Liveness(factor=5, floor_s=3, cold_s=6))
    assert tight.look_every_s(2.0) == 2.0           # a short deadline: the least interval


def test_a_silent_worker_of_a_single_task_is_named_once_until_it_is_heard_again():
    reports = SilenceReports(limit_s=20)
    seen = {"gpu-0": 100.0, "gpu-1": 130.0}
    assert reports.newly_silent(seen, ["gpu-0", "gpu-1"]) == {"gpu-0": 30.0}
    assert reports.newly_silent({**seen, "gpu-1": 131.0}, ["gpu-0", "gpu-1"]) == {}
    assert reports.newly_silent({"gpu-0": 131.0, "gpu-1": 131.0}, ["gpu-0", "gpu-1"]) == {}
    assert reports.newly_silent({"gpu-0": 131.0, "gpu-1": 160.0}, ["gpu-0"]) == {"gpu-0": 29.0}
    assert SilenceReports(limit_s=0).newly_silent(seen, ["gpu-0"]) == {}
