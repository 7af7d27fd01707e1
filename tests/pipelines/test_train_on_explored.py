"""``objective.train_on_explored``: an iteration whose seeds were chosen among explored candidates
trains on those candidates' samples and exploration rewards instead of rolling them out again.

The samples kept are the ones a rollout of the same seeds with the exploring weights draws (up
to the rounding of another batch shape), their rewards are those samples' rewards, and the
cluster and the harness train on them alike, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.run import tasks
from pipelines.run.explored import explored_finals
from pipelines.run.inprocess import InProcessRun
from pipelines.run.recording import read_selection
from pipelines.run.rollout import rollout_task
from pipelines.run.rollout_store import read_rollout
from pipelines.run.tasks import stage_name
from spotlight.config import ConfigError


@pytest.fixture
def explored_config(tiny_run_config):
    return tiny_run_config.with_values({"objective.kind": "nft",
                                        "objective.train_on_explored": True})


def test_flow_grpo_cannot_train_on_explored_samples(tiny_run_config):
    with pytest.raises(ConfigError, match="objective.kind: nft"):
        tiny_run_config.with_values({"objective.train_on_explored": True})


def _explored(store, k: int) -> bool:
    """Whether iteration k's rollout is the explored samples (its one request, ``explored``)."""
    return bool(store.array_names(stage_name(k, "rollout"), "request-explored"))


def test_the_harness_trains_on_the_samples_exploration_drew(explored_config):
    harness = InProcessRun(explored_config, "spotlight")
    try:
        run = harness.run_iterations(3)
        store, prompts = harness.store, harness.prompts(1)
        selection = read_selection(store, harness.log, 1)
        _, kept = read_rollout(store, stage_name(1, "rollout"))
        rewards = store.get_arrays(stage_name(1, "reward"), "reward")["rewards"]
        explored = [_explored(store, k) for k in range(3)]
        # The same seeds rolled out now with θ_0, the weights that explored them.
        fresh = rollout_task(explored_config, store,
                             tasks.RolloutRequest(1, prompts, selection.seeds, 0))
        scored = tasks.reward_task(explored_config, store, fresh, prompts,
                                   explored_config.grpo.group_size, 1)
    finally:
        harness.close()
    assert [it.source for it in run.iterations] == ["random", "explore", "explore"]
    assert explored == [False, True, True]
    assert kept.shape[1] == 1   # the final latent only: nothing else is trained on
    # Sampled in batches of another shape (a prompt's candidates, not its group): the same
    # samples up to float rounding (measured: 1e-6 apart, rewards 1e-8 apart).
    torch.testing.assert_close(torch.from_numpy(kept[:, -1]), fresh.trajectory.final,
                               rtol=0, atol=1e-5)
    np.testing.assert_array_equal(rewards, selection.selected_rewards)
    np.testing.assert_allclose(rewards, scored["rewards"], rtol=1e-5)
    assert rewards.std(axis=1).max() > 0   # a group with signal: the comparison is not 0 == 0


def test_awm_trains_on_the_explored_samples_too(tiny_run_config):
    """Advantage Weighted Matching needs no log-probabilities either: an iteration with explored
    seeds trains on those samples, without a rollout of its own."""
    config = tiny_run_config.with_values({"objective.kind": "awm",
                                          "objective.train_on_explored": True})
    harness = InProcessRun(config, "spotlight")
    try:
        run = harness.run_iterations(2)
        explored = [_explored(harness.store, k) for k in range(2)]
        trained = [harness.store.load_checkpoint(k).weights for k in (1, 2)]
    finally:
        harness.close()
    assert [it.source for it in run.iterations] == ["random", "explore"]
    assert explored == [False, True]
    assert any(not torch.equal(t, trained[1][n]) for n, t in trained[0].items())


def explore_half_the_prompts(monkeypatch, iterations: set[int]) -> None:
    """The plans that explore ``iterations`` take the first half of the prompts alone, as the
    planner's do when no setting fits every prompt in the window."""
    from spotlight.exploration.planner import Plan
    from spotlight.iteration.program import IterationProgram
    from spotlight.iteration.requests import RecordPlan

    planned = IterationProgram.plan

    def halved(self, iteration):
        recorded = self.stages.get(iteration, "plan")
        if iteration not in iterations or recorded is not None:
            return (yield from planned(self, iteration))
        cfg = self.config
        plan = Plan(iteration, cfg.exploration.candidates, cfg.sampler.num_steps,
                    cfg.grpo.prompts_per_iteration // 2, None, None, None, "half the prompts")
        yield RecordPlan(plan, self.time.now(), announce=False)
        return plan

    monkeypatch.setattr(IterationProgram, "plan", halved)


def test_a_plan_of_half_the_prompts_samples_only_the_others_and_trains_on_both(
        explored_config, monkeypatch):
    """Partial reuse: iteration 1's plan explored half its prompts. Only the other half is
    rolled out; the rollout the iteration trains on holds, prompt by prompt, the explored
    samples of the first half and the sampled ones of the second, and the whole is scored."""
    explore_half_the_prompts(monkeypatch, {1})
    harness = InProcessRun(explored_config, "spotlight")
    try:
        run = harness.run_iterations(2)
        store, k = harness.store, 1
        stage = stage_name(k, "rollout")
        selection = read_selection(store, harness.log, k)
        _, joined = read_rollout(store, stage)
        explored = explored_finals(store, stage_name(k, "explore"))
        parts = store.array_names(stage, "request-r")   # the part's requests, named apart
        sampled = np.concatenate([store.get_arrays(stage, n)["latents"][:, -1]
                                  for n in sorted(parts)])
        rewards = store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
        record = harness.log.get(k, "rollout").task
    finally:
        harness.close()
    prompts, group = selection.seeds.shape
    half = prompts // 2
    assert run.iterations[1].source == "explore" and run.iterations[1].trained_on_explored
    assert np.isfinite(selection.selected_rewards[:half]).all()
    assert np.isnan(selection.selected_rewards[half:]).all()   # left to random seeds
    assert record["explored"] == "explore" and record["rolled_out"] == (prompts - half) * group
    assert run.iterations[1].sampled == 0.5
    assert joined.shape[:2] == (prompts * group, 1) and len(sampled) == (prompts - half) * group
    for p in range(half):   # the explored samples of the selected seeds, as exploration drew them
        for g, seed in enumerate(selection.seeds[p]):
            np.testing.assert_array_equal(joined[p * group + g, 0], explored[(p, int(seed))])
    np.testing.assert_array_equal(joined[half * group:, 0], sampled)   # then the sampled half
    # Scored as a whole: the explored half scores what exploration scored.
    np.testing.assert_allclose(rewards[:half], selection.selected_rewards[:half], rtol=1e-5)
    assert np.isfinite(rewards).all() and rewards[half:].std(axis=1).max() > 0


class Crash(Exception):
    """Stands for the driver dying right after a stage was recorded."""


@pytest.mark.timeout(900)
def test_the_cluster_trains_on_explored_samples_as_the_harness_does_across_a_crash(
        explored_config, tmp_path, monkeypatch):
    """The driver dies right after recording iteration 1's explored rollout (its rewards not
    yet recorded); the resumed run reads both back and ends where the harness does.
    Iteration 2's plan explored half its prompts: the cluster samples the other half and joins
    them as the harness does. The run samples with a moving average of the trained weights
    (objective.sampling_ema), so the resumed trainer must take both back from the checkpoint."""
    from pipelines.front.session import Session
    from pipelines.run.stage_log import StageLog

    url, record = str(tmp_path / "run"), StageLog.record
    explored_config = explored_config.with_values({"objective.sampling_ema": 0.5})

    def crashing_record(self, iteration, name, result):
        record(self, iteration, name, result)
        if (iteration, name) == (1, "rollout"):
            raise Crash()

    explore_half_the_prompts(monkeypatch, {2})
    monkeypatch.setattr(StageLog, "record", crashing_record)
    with Session.from_config(explored_config, store=url) as session:
        with pytest.raises(Crash):
            session.run(3)
    monkeypatch.setattr(StageLog, "record", record)
    with Session.resume(url) as session:
        session.run(3 - session.completed_iterations())
        store = session.store
        cluster = {"explored": [_explored(store, k) for k in range(3)],
                   "rewards": [store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
                               for k in range(3)],
                   "weights": store.load_checkpoint(3).weights,
                   "taus": [r.kendall_tau for r in session.results],
                   "waits": [(r.explored, r.explore_wait_s) for r in session.results],
                   "tasks": [store.get_json(stage_name(k, "iteration"), "tasks")["tasks"]
                             for k in range(3)]}
    harness = InProcessRun(explored_config, "spotlight", base_val_reward=0.0)
    try:
        assert [it.sampled for it in harness.run_iterations(3).iterations] == [1.0, 0.0, 0.5]
        rewards = [harness.store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
                   for k in range(3)]
        weights = harness.store.load_checkpoint(3).weights
    finally:
        harness.close()
    assert cluster["explored"] == [False, True, True]
    # Exploration scored the samples: nothing rolls them out or scores them again, the resumed
    # iteration 1 included. Iteration 2 sampled only the unexplored half, and scored the whole.
    stages = [[t["stage"] for t in tasks] for tasks in cluster["tasks"]]
    assert [s.count("reward") for s in stages] == [1, 0, 1]
    rolled = [t for t in cluster["tasks"][2] if t["stage"] == "rollout"]
    group = explored_config.grpo.group_size
    half = explored_config.grpo.prompts_per_iteration // 2
    assert [t.get("explored") for t in rolled][-2:] == [None, "explore"]   # the part, joined
    assert rolled[-1]["rolled_out"] == half * group
    # τ of the selected seeds compares exploration's rewards with the rollout's: trained on
    # exploration's own, there is nothing to compare.
    assert cluster["taus"][1] is None and cluster["taus"][2] is None
    # Each iteration that explored the next one says how long it then waited for that.
    assert [explored > 0 for explored, _ in cluster["waits"]] == [True, True, False]
    assert all(wait >= 0.0 for _, wait in cluster["waits"][:2]) and cluster["waits"][2][1] is None
    for k in range(3):
        np.testing.assert_array_equal(rewards[k], cluster["rewards"][k])
    assert all(torch.equal(weights[name], cluster["weights"][name]) for name in weights)


def test_sync_exploration_trains_on_what_the_current_weights_explored(explored_config):
    """Sync explores with θ_k on the critical path: every iteration, the first too, trains on
    those samples (on-policy ones), from the explore-sync stage."""
    harness = InProcessRun(explored_config, "sync")
    try:
        run = harness.run_iterations(2)
        explored = [_explored(harness.store, k) for k in range(2)]
        rewards = harness.store.get_arrays(stage_name(1, "reward"), "reward")["rewards"]
        selection = read_selection(harness.store, harness.log, 1)
    finally:
        harness.close()
    assert [it.source for it in run.iterations] == ["sync", "sync"] and explored == [True, True]
    np.testing.assert_array_equal(rewards, selection.selected_rewards)


@pytest.mark.parametrize("rollout_s,covered", [(5.0, True), (1.0, False), (None, False)])
def test_the_planner_explores_every_prompt_when_that_beats_sampling_the_rollout(
        explored_config, rollout_s, covered):
    """The cheapest plan, 2 prompts x 6 candidates x 3 steps x 0.1 s = 3.6 s, overruns the
    0.9 s budget by 2.7 s. Against a 5 s rollout that exploring every prompt saves, it is
    planned and the next iteration trains on its samples; against a 1 s rollout (or none
    measured) nothing that fits is worth it, and the iteration samples its rollout."""
    from spotlight.iteration import TimeModel

    config = explored_config.with_values({"planner.enabled": True, "planner.candidates": [6],
                                          "planner.steps": [0]})
    harness = InProcessRun(config, "spotlight", base_val_reward=0.0,
                      time_model=TimeModel(1.0, 0.1, 1, rollout_s))
    try:
        run = harness.run_iterations(2)
    finally:
        harness.close()
    plan = run.iterations[0].plan
    assert (plan == (6, 3, 2)) is covered and (plan[2] == 0) is not covered
    assert [it.trained_on_explored for it in run.iterations] == [False, covered]
