"""The exploration planner on a simulated clock: never past its budget, converges, resumes."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spotlight.config import ConfigError, PlannerConfig
from spotlight.exploration.planner import (
    ExplorationPlanner,
    exploration_window_s,
    plan_cost,
    predict_train_seconds,
)

PROMPTS, GROUP, ROLLOUT_STEPS = 16, 8, 10


def _simulate(planner: ExplorationPlanner, iterations: int, seed: int, true_gain: dict,
              slots=lambda rng: int(rng.integers(0, 4))) -> list:
    """Training times drift, the step cost is noisy, spot slots come and go."""
    rng = np.random.default_rng(seed)
    train_history, plans = [], []
    for k in range(iterations):
        train_s = float(4.0 + 2.0 * np.sin(k / 15) + rng.normal(0, 0.3))
        rate = float(0.003 * rng.uniform(0.8, 1.2))
        spot_slots = slots(rng)
        plan = planner.plan(k, PROMPTS, GROUP, spot_slots, list(train_history), rate, ROLLOUT_STEPS)
        plans.append(plan)
        if plan.candidates and plan.arm is not None:
            actual = plan_cost(plan.prompts, plan.candidates, plan.steps, rate)
            gain = true_gain[plan.candidates] + rng.normal(0, 0.02)
            # The slots were billed for the whole window, whatever the plan computed in it.
            planner.record(plan, actual, selected_std=0.2 * gain, random_std=0.2,
                           billed_s=train_s * spot_slots)
        train_history.append(train_s)
    return plans


def test_never_plans_past_the_budget_on_a_simulated_clock():
    planner = ExplorationPlanner(PlannerConfig(candidates=[8, 16, 32], steps=[0, 5]))
    plans = _simulate(planner, 200, seed=1, true_gain={8: 1.1, 16: 1.3, 32: 1.4})
    budgeted = [p for p in plans if p.budget_s is not None and p.candidates]
    assert len(budgeted) > 100
    for p in budgeted:
        assert p.predicted_s <= p.budget_s + 1e-9
        assert p.candidates > GROUP and 1 <= p.prompts <= PROMPTS
    assert all(p.candidates == 0 or p.candidates > GROUP for p in plans)   # N = G selects nothing


def test_ucb_settles_on_the_best_affordable_setting():
    # Every arm fits (cheap steps, generous training time); 16 candidates pays best per second.
    planner = ExplorationPlanner(PlannerConfig(candidates=[8, 16, 32], steps=[0], gamma=0.1,
                                               payoff="busy"))
    # Gain over random per busy spot-second: 8 -> 0.05/c, 16 -> 0.6/2c, 32 -> 0.7/4c: 16 wins.
    gain = {8: 1.05, 16: 1.6, 32: 1.7}
    plans = _simulate(planner, 150, seed=2, true_gain=gain, slots=lambda rng: 2)
    late = [p.candidates for p in plans[-50:]]
    assert late.count(16) >= 40


def test_billed_payoff_settles_on_the_largest_spread_that_fits():
    """Every arm fits (16 slots). Paid per busy spot-second the cheap 16 candidates win; paid
    per billed spot-second (the window, whatever ran in it) idle paid-for time earns nothing,
    so the setting with the most spread wins."""
    gain = {8: 1.05, 16: 1.6, 32: 1.7}
    late = {}
    for payoff in ("busy", "billed"):
        planner = ExplorationPlanner(PlannerConfig(candidates=[8, 16, 32], steps=[0], gamma=0.1,
                                                   payoff=payoff))
        plans = _simulate(planner, 150, seed=2, true_gain=gain, slots=lambda rng: 16)
        assert all(p.predicted_s <= p.budget_s + 1e-9 for p in plans if p.budget_s)
        late[payoff] = [p.candidates for p in plans[-50:]]
    assert late["busy"].count(16) >= 40 and late["billed"].count(32) >= 40


def test_cold_start_no_slots_and_shrinking():
    planner = ExplorationPlanner(PlannerConfig(candidates=[16, 32], steps=[0]))
    cold = planner.plan(0, PROMPTS, GROUP, 1, [], None, ROLLOUT_STEPS)
    assert (cold.candidates, cold.budget_s) == (16, None) and "cold start" in cold.reason
    small = ExplorationPlanner(PlannerConfig(candidates=[8, 16])).plan(0, PROMPTS, GROUP, 1, [],
                                                                      None, ROLLOUT_STEPS)
    assert small.candidates == 16   # 8 = G would keep every candidate
    none = planner.plan(1, PROMPTS, GROUP, 0, [5.0], 0.003, ROLLOUT_STEPS)
    assert none.candidates == 0 and "no spot slots" in none.reason
    # 16 prompts x 16 x 10 steps x 0.01 s = 25.6 s > 0.9 x 5 s: 16 candidates on 2 prompts fit
    # (N = G would keep every candidate and gain nothing, so the smallest useful N is kept).
    shrunk = planner.plan(2, PROMPTS, GROUP, 1, [5.0], 0.01, ROLLOUT_STEPS)
    assert (shrunk.candidates, shrunk.prompts) == (16, 2) and "over budget" in shrunk.reason
    assert shrunk.predicted_s <= shrunk.budget_s
    hopeless = planner.plan(3, PROMPTS, GROUP, 1, [0.1], 0.01, ROLLOUT_STEPS)
    assert hopeless.candidates == 0 and "skipped" in hopeless.reason


def test_where_samples_replace_the_rollout_every_prompt_is_explored_if_that_is_sooner():
    """16 prompts x 16 x 10 steps x 0.01 s = 25.6 s against a 4.5 s budget: 21.1 s over.
    Within the budget 2 prompts fit, and the 14 left unexplored are sampled: 14/16 of the
    rollout. A rollout whose 14/16 is longer than the overrun (24.2 s: 21.18 s) makes the
    planner explore every prompt at its cheapest setting; a shorter one (21.2 s, which the
    whole rollout would have beaten before partial reuse; or none to replace) leaves it
    shrinking to what fits."""
    planner = ExplorationPlanner(PlannerConfig(candidates=[16, 32], steps=[0]))
    covering = planner.plan(2, PROMPTS, GROUP, 1, [5.0], 0.01, ROLLOUT_STEPS,
                            replaced_rollout_s=24.2)
    assert (covering.candidates, covering.steps, covering.prompts) == (16, 10, PROMPTS)
    assert covering.predicted_s == pytest.approx(25.6) and covering.arm == 0
    assert "every prompt" in covering.reason and "14 prompts" in covering.reason
    for rollout_s in (24.0, 21.2, None):
        shrunk = planner.plan(2, PROMPTS, GROUP, 1, [5.0], 0.01, ROLLOUT_STEPS,
                              replaced_rollout_s=rollout_s)
        assert (shrunk.candidates, shrunk.prompts) == (16, 2)
    # What fits is planned as before: the rollout to replace changes nothing there.
    fits = planner.plan(4, PROMPTS, GROUP, 1, [5.0], 0.001, ROLLOUT_STEPS, replaced_rollout_s=9.0)
    assert fits.prompts == PROMPTS and fits.predicted_s <= fits.budget_s


def test_fewer_candidates_cover_every_prompt_where_the_iteration_waits_less_for_them():
    """16 prompts x 16 x 10 steps x 0.002 s = 5.12 s against a 4.5 s budget: 14 prompts fit
    (4.48 s) and 2 are left to the rollout; 16 on every prompt overruns by 0.62 s. 12
    candidates on every prompt cost 3.84 s and fit: with a 4.0 s rollout (the 2 prompts' share
    0.5 s) the planner takes them; without cover_candidates, without a rollout to replace, or
    where the 16 fit, it plans as before."""
    config = PlannerConfig(candidates=[16, 32], steps=[0], cover_candidates=12)
    cover = ExplorationPlanner(config).plan(2, PROMPTS, GROUP, 1, [5.0], 0.002, ROLLOUT_STEPS,
                                             replaced_rollout_s=4.0)
    assert (cover.candidates, cover.steps, cover.prompts, cover.arm) == (12, 10, PROMPTS, None)
    assert cover.predicted_s == pytest.approx(3.84) and "every prompt" in cover.reason
    assert "0.50 s that 16 candidates on 14 prompts" in cover.reason
    for planner, rollout_s in ((ExplorationPlanner(replace(config, cover_candidates=0)), 4.0),
                               (ExplorationPlanner(config), None)):
        shrunk = planner.plan(2, PROMPTS, GROUP, 1, [5.0], 0.002, ROLLOUT_STEPS,
                              replaced_rollout_s=rollout_s)
        assert (shrunk.candidates, shrunk.prompts) == (16, 14)
    fits = ExplorationPlanner(config).plan(2, PROMPTS, GROUP, 1, [5.0], 0.001, ROLLOUT_STEPS,
                                           replaced_rollout_s=4.0)
    assert fits.candidates == 16 and fits.prompts == PROMPTS and fits.arm is not None
    # 12 on every prompt past the budget: taken only when its overrun is under the wait it
    # replaces (0.002 -> 0.0025 s a step: 4.8 s, 0.3 s over; 16 fit on 11 prompts, 5 left).
    for rollout_s, taken in ((4.0, True), (0.9, False)):
        plan = ExplorationPlanner(config).plan(2, PROMPTS, GROUP, 1, [5.0], 0.0025,
                                               ROLLOUT_STEPS, replaced_rollout_s=rollout_s)
        assert (plan.candidates == 12) is taken and plan.prompts == (PROMPTS if taken else 11)


def test_cover_candidates_must_select_and_stay_under_the_arms():
    from spotlight.config import RunConfig
    base = RunConfig()   # spotlight mode, the planner on, G = 8, arms [16, 24, 32]
    assert base.with_values({"planner.cover_candidates": 12}).planner.cover_candidates == 12
    for bad in (8, 16):   # G = 8 selects nothing; 16 is an arm already
        with pytest.raises(ConfigError, match="planner.cover_candidates"):
            base.with_values({"planner.cover_candidates": bad})


def test_deterministic_and_resumable():
    gain = {8: 1.1, 16: 1.3, 24: 1.35, 32: 1.4}
    a = _simulate(ExplorationPlanner(PlannerConfig()), 60, seed=4, true_gain=gain)
    b = _simulate(ExplorationPlanner(PlannerConfig()), 60, seed=4, true_gain=gain)
    assert a == b
    planner = ExplorationPlanner(PlannerConfig())
    _simulate(planner, 30, seed=5, true_gain=gain)
    copy = ExplorationPlanner.from_dict(planner.config, planner.to_dict())
    args = (30, PROMPTS, GROUP, 2, [5.0, 5.5], 0.002, ROLLOUT_STEPS)
    assert copy.plan(*args) == planner.plan(*args)
    with pytest.raises(ValueError, match="arms"):
        ExplorationPlanner.from_dict(PlannerConfig(candidates=[8]), planner.to_dict())


def test_every_decision_and_outcome_is_an_event():
    planner = ExplorationPlanner(PlannerConfig())
    plan = planner.plan(0, PROMPTS, GROUP, 1, [], None, ROLLOUT_STEPS)
    planner.record(plan, actual_s=2.0, selected_std=0.3, random_std=0.2)
    kinds = [e["kind"] for e in planner.events]
    assert kinds == ["plan", "outcome"]
    assert planner.events[1]["actual_s"] == 2.0
    assert planner.events[1]["payoff"] == pytest.approx(0.25)


def test_helpers_and_config_errors():
    assert predict_train_seconds([], 5) is None
    assert predict_train_seconds([1, 2, 3, 4], 2) == pytest.approx(3.5)
    assert plan_cost(2, 8, 10, 0.01) == pytest.approx(1.6)
    with pytest.raises(ConfigError, match="candidates"):
        PlannerConfig(candidates=[])
    with pytest.raises(ConfigError, match="budget_fraction"):
        PlannerConfig(budget_fraction=2.0)


def test_exploration_window_is_training_or_rollout_to_training_end():
    rollout, train = {"start": 10.0, "end": 14.0}, {"start": 15.0, "end": 21.0}
    assert exploration_window_s(rollout, train, "train") == pytest.approx(6.0)
    assert exploration_window_s(rollout, train, "iteration") == pytest.approx(11.0)
    assert exploration_window_s(None, train, "iteration") is None   # resumed rollout: unmeasured
    assert exploration_window_s(rollout, None, "train") is None
    with pytest.raises(ValueError, match="'whole'"):
        exploration_window_s(rollout, train, "whole")


def test_replay_steps_past_the_rollouts_mean_the_rollouts_own():
    planner = ExplorationPlanner(PlannerConfig(candidates=[16], steps=[12, 6]))
    first = planner.plan(0, PROMPTS, GROUP, 1, [], None, ROLLOUT_STEPS)
    assert first.steps == 6   # cold start: the cheapest arm, the 6-step replay
    assert planner._steps(planner.arms.index((16, 12)), ROLLOUT_STEPS) == ROLLOUT_STEPS


@pytest.mark.parametrize("gamma", [0.3, 0.0])
def test_the_exploration_bonus_revisits_an_arm_that_looked_worse(gamma):
    """UCB, not greedy: an arm tried once with a slightly lower payoff is tried again as the
    better-looking one piles up pulls -- and only because of the bonus (gamma)."""
    # Paid per busy second (the same 1 s for both here): under billed payoff 16 candidates,
    # dominated by 32 at the same steps, would not be tried at all.
    planner = ExplorationPlanner(PlannerConfig(candidates=[16, 32], steps=[0], gamma=gamma,
                                               payoff="busy"))
    gain = {16: 1.50, 32: 1.45}   # as measured: 32 candidates looks a little worse
    chosen = []
    for k in range(40):
        plan = planner.plan(k, PROMPTS, GROUP, 4, [100.0], 0.001, ROLLOUT_STEPS)
        chosen.append(plan.candidates)
        planner.record(plan, 1.0, selected_std=0.2 * gain[plan.candidates], random_std=0.2,
                       billed_s=1.0)
    assert chosen[:2] == [16, 32]   # every fitting arm once, cheapest first
    revisits = chosen[2:].count(32)
    if gamma:
        assert revisits >= 2, chosen
    else:
        assert revisits == 0, chosen


def test_billed_payoff_tries_only_the_settings_no_fitting_one_dominates():
    """Billed spot time costs the same whatever runs in it and the spread grows with N and M,
    so of the fitting arms only the undominated ones are tried: with room for everything, the
    most candidates at the full replay at once; with room for N x M <= 150 per prompt, 16 x 7
    and 24 x 6 (16 x 6 is dominated by both)."""
    config = PlannerConfig(candidates=[16, 24, 32], steps=[0, 7, 6])
    roomy = ExplorationPlanner(config)
    assert {roomy.plan(k, PROMPTS, GROUP, 1, [100.0], 0.001, ROLLOUT_STEPS).candidates
            for k in range(6)} == {32}
    assert roomy.events[0]["steps"] == ROLLOUT_STEPS and roomy.events[0]["reason"] == \
        "untried setting"
    # 0.9 x 10 s / (16 prompts x 0.0037 s) = 152 sample-steps a prompt.
    tried = {}
    for prune in (True, False):
        tight = ExplorationPlanner(PlannerConfig(candidates=[16, 24, 32], steps=[0, 7, 6],
                                                 prune_dominated=prune))
        tried[prune] = set()
        for k in range(8):
            plan = tight.plan(k, PROMPTS, GROUP, 1, [10.0], 0.0037, ROLLOUT_STEPS)
            tried[prune].add((plan.candidates, plan.steps))
            tight.record(plan, 1.0, selected_std=0.25, random_std=0.2, billed_s=10.0)
    assert tried[True] == {(16, 7), (24, 6)}
    assert tried[False] == {(16, 7), (16, 6), (24, 6)}


def test_every_field_of_a_plan_is_what_the_driver_acts_on():
    """Whole plans, not just N: the driver explores ``prompts`` prompts with N candidates over
    ``steps`` steps, and the run records the budget, prediction, arm and slots."""
    from spotlight.exploration.planner import Plan

    planner = ExplorationPlanner(PlannerConfig(candidates=[16, 32], steps=[0, 4],
                                               budget_fraction=0.5))
    # Cheapest useful arm by candidates x steps: (16, 4) = 64 sample-steps, not (16, 0) = 160.
    assert planner.plan(7, 3, 8, 0, [10.0], 0.01, 10) == Plan(
        7, 0, 10, 0, None, 5.0, None, "no spot slots: exploration skipped, random seeds", 0)
    assert planner.plan(8, 3, 8, 2, [], None, 10) == Plan(
        8, 16, 4, 3, None, None, planner.arms.index((16, 4)),
        "cold start: cheapest setting until time is measured", 2)
    # 3 prompts x 16 x 4 steps x 0.05 s / 2 slots = 4.8 s against a 10 s x 0.5 budget: it fits.
    fits = planner.plan(9, 3, 8, 2, [10.0], 0.05, 10)
    assert (fits.iteration, fits.prompts, fits.budget_s, fits.slots) == (9, 3, 5.0, 2)
    assert fits.predicted_s == pytest.approx(4.8) and fits.predicted_s <= fits.budget_s
    # A plan that exactly fills the budget still fits (<=): 3 x 16 x 4 x s / 2 = 5.0 s.
    exact = planner.plan(10, 3, 8, 2, [10.0], 5.0 * 2 / (3 * 16 * 4), 10)
    assert (exact.candidates, exact.steps, exact.prompts) == (16, 4, 3)


def test_the_sampler_leaves_out_replay_steps_that_would_not_replay_the_rollout():
    from spotlight.config import SamplerConfig

    all_sde = SamplerConfig(num_steps=10, sde_window_size=0)   # no shorter replay is faithful
    config = PlannerConfig(candidates=[16], steps=[0, 3, 5, 10])
    assert {m for _, m in ExplorationPlanner(config, all_sde).arms} == {0, 10}
    assert {m for _, m in ExplorationPlanner(config).arms} == {0, 3, 5, 10}
