"""A scenario small enough to work out by hand: one on-demand GPU, one spot GPU, one preemption.

Four rollout requests of 10 one-second steps; the spot instance is killed without notice at
t = 15 while its second request has committed 5 steps. Spotlight resumes that request on the
on-demand GPU from step 5 (plus 0.5 s reading the latent back); RLBoost, which commits no step,
runs it again from the start. Training then takes 4 images x 2.5 GPU-s on one GPU = 10 s.
"""
from __future__ import annotations

import pytest

from spotlight.scheduling.traces import SpotTrace
from spotlight.sim.config import SimConfig
from spotlight.sim.systems import SystemRun

PRICES = {"gpu": 6.0, "spot": 2.0}
KILL = SpotTrace("hand", ((0.0, 1), (15.0, 0), (100.0, 1)), 200.0)


def hand_config(**extra) -> SimConfig:
    values = {
        "workload.prompts_per_iteration": 1, "workload.group_size": 4,
        "workload.rollout_request_images": 1, "workload.rollout_steps": 10,
        "workload.candidates": 8, "workload.reward_s_per_image": 0.0,
        "timing.step_s": 1.0, "timing.batch_exponent": 0.0, "timing.train_s_per_image": 2.5,
        "timing.weight_sync_s": 0.0, "timing.resume_s": 0.5,
        "cluster.ondemand_gpus": 1, "cluster.spot_ratio": 1.0, "cluster.notice_s": 0.0,
        "convergence.ondemand_iterations": 1, **extra}
    return SimConfig(name="hand").with_values(values)


def spans_of(system: str) -> tuple[list[tuple], SystemRun]:
    run = SystemRun(hand_config(), system, KILL, PRICES, timeline_iteration=0)
    result = run.run()
    lanes = {name: "spot" if not name.startswith("od") else name
             for name, *_ in result.spans}
    spans = sorted((lanes[n], round(s, 6), round(e, 6), what) for n, s, e, what in result.spans)
    return spans, result


def test_spotlight_resumes_the_killed_request_from_its_committed_step():
    spans, result = spans_of("spotlight")
    assert spans == [
        ("od0", 0.0, 10.0, "rollout:done"),
        ("od0", 10.0, 20.0, "rollout:done"),
        ("od0", 20.0, 25.5, "rollout:done"),       # 5 steps left + 0.5 s resume
        ("od0", 25.5, 35.5, "train"),
        ("spot", 0.0, 10.0, "rollout:done"),
        ("spot", 10.0, 15.0, "rollout:lost"),
    ]
    it = result.iterations[0]
    assert (it.start, it.end, it.rollout_s, it.train_s) == (0.0, 35.5, 25.5, 10.0)
    assert it.hard_preemptions == 1 and result.preemptions == 1


def test_rlboost_runs_the_killed_request_again_from_the_start():
    spans, result = spans_of("rlboost")
    assert [s for s in spans if s[0] == "od0"] == [
        ("od0", 0.0, 10.0, "rollout:done"),
        ("od0", 10.0, 20.0, "rollout:done"),
        ("od0", 20.0, 30.0, "rollout:done"),       # all 10 steps again
        ("od0", 30.0, 40.0, "train"),
    ]
    assert result.iterations[0].end == 40.0


def test_cost_is_the_hand_sum_of_gpu_hours_times_prices():
    _, result = spans_of("spotlight")
    # On-demand GPU for the whole 35.5 s; the spot GPU until it was killed at 15 s.
    expected = 6.0 * 35.5 / 3600 + 2.0 * 15.0 / 3600
    assert result.cost_usd["total"] == pytest.approx(expected, rel=1e-12)
    assert result.gpu_hours == pytest.approx({"ondemand": 35.5 / 3600, "spot": 15.0 / 3600})


def test_on_demand_systems_rent_no_spot_capacity():
    _, result = spans_of("ondemand")
    assert result.cost_usd["spot"] == 0.0 and result.gpu_hours["spot"] == 0.0
    # Two requests at a time cannot happen on one GPU: 4 x 10 s, then training.
    assert result.iterations[0].end == 50.0


def test_a_notice_hands_the_request_back_at_its_step_boundary():
    config = hand_config(**{"cluster.notice_s": 2.5})   # the notice comes at t = 12.5
    result = SystemRun(config, "rlboost", KILL, PRICES, timeline_iteration=0).run()
    spans = sorted((n if n.startswith("od") else "spot", s, e, w) for n, s, e, w in result.spans)
    # The spot request stops at the boundary after the notice (t = 13, 3 steps done) and the
    # on-demand GPU carries it on from step 3: 7 steps + 0.5 s from t = 20.
    assert ("spot", 10.0, 13.0, "rollout:handed back") in spans
    assert ("od0", 20.0, 27.5, "rollout:done") in spans
    assert result.iterations[0].graceful_preemptions == 1


def test_a_dispatch_delay_comes_before_each_attempt_computes():
    """``timing.dispatch_s`` (what `spotlight bench scale` measures): each attempt reaches its
    worker 1 s after it is handed out. The spot request killed at 15 has computed 3 of its
    steps by then (it started at 12), so it resumes from step 3."""
    run = SystemRun(hand_config(**{"timing.dispatch_s": 1.0}), "spotlight", KILL, PRICES,
                    timeline_iteration=0)
    result = run.run()
    spans = sorted((n.startswith("od"), round(s, 6), round(e, 6), what)
                   for n, s, e, what in result.spans)
    assert spans == [
        (False, 1.0, 11.0, "rollout:done"),
        (False, 12.0, 15.0, "rollout:lost"),
        (True, 1.0, 11.0, "rollout:done"),
        (True, 12.0, 22.0, "rollout:done"),
        (True, 23.0, 30.5, "rollout:done"),      # 7 steps left + 0.5 s resume
        (True, 30.5, 40.5, "train"),
    ]
