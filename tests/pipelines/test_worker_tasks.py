"""The worker's task functions (``pipelines/run/tasks.py``) called in one process, as a worker would
run them: one iteration's chain, weights through the run store, resume, the per-process context."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipelines.cluster.runtime import reset_runtime
from pipelines.run import tasks
from pipelines.run.rollout import rollout_task
from spotlight.models.pretrain import load_base_policy, pretrain
from spotlight.models.prompts import load_prompts
from spotlight.rl.trainer import iteration_prompts, random_seeds
from storage import RunStore


@pytest.fixture
def run(tiny_run_config, tmp_path):
    pretrain(tiny_run_config)
    store = RunStore.open(str(tmp_path / "run"))
    store.save_checkpoint(0, load_base_policy(tiny_run_config).state_dict(), None)
    prompts = load_prompts(tiny_run_config.world.train_prompts, "ocr")
    yield tiny_run_config, store, prompts
    reset_runtime()


def test_one_iteration_chain_moves_the_weights_one_version(run):
    config, store, all_prompts = run
    group = config.grpo.group_size
    prompts = iteration_prompts(all_prompts, 0, config.grpo.prompts_per_iteration, config.seed)
    seeds = random_seeds(config.seed, 0, len(prompts), group)
    rollout = rollout_task(config, store, tasks.RolloutRequest(0, prompts, seeds, 0))
    assert rollout.record["stage"] == "rollout" and rollout.record["weights_version"] == 0
    assert rollout.record["worker"].startswith("local-")   # outside Dask: named by its pid
    reward = tasks.reward_task(config, store, rollout, prompts, group, 0)
    assert reward["rewards"].shape == (len(prompts), group)
    np.testing.assert_array_equal(store.get_arrays("iter-0/reward", "reward")["rewards"],
                                  reward["rewards"])
    adv = tasks.advantages_task(config, 0, reward["rewards"], 0)
    trained = tasks.train_task(config, store, rollout,
                               tasks.TrainRequest(0, prompts, reward["rewards"], adv, 0))
    saved = tasks.checkpoint_task(config, store, trained, 0, 0)
    assert store.latest_checkpoint() == 0   # written, not yet committed: the driver does that
    store.commit_checkpoint(saved["checkpoint"])
    assert store.latest_checkpoint() == 1 and saved["checkpoint"]["iteration"] == 1
    assert [r["stage"] for r in saved["records"]] == ["train", "checkpoint"]
    stored = store.load_checkpoint(1).weights
    assert stored and all(torch.equal(stored[k], v) for k, v in trained["weights"].items())
    # The worker's context now holds version 1: the next rollout loads nothing.
    ctx = tasks.context(config, store)
    assert ctx.version == 1 and ctx.trainer_version == 1


def test_the_context_is_one_per_run_and_config(run, tmp_path):
    config, store, _ = run
    assert tasks.context(config, store) is tasks.context(config, store)
    other = config.with_values({"grpo.lr": 1e-4})
    assert tasks.context(other, store) is not tasks.context(config, store)


def test_exploration_is_deterministic_and_resumes_bit_for_bit(run):
    config, store, all_prompts = run
    prompt, seeds = all_prompts[0], np.arange(5)
    first = tasks.explore_task(config, store, tasks.ExploreRequest(1, 0, prompt, seeds, 0, 0))
    assert first.rewards.shape == (5,) and first.record["samples"] == 5
    # A fresh stage, cut after two committed steps, then resumed in another attempt.
    where, request = tasks.stage_name(1, "audit"), tasks.explore_request(0, 0)
    tasks.explore_task(config, store,
                       tasks.ExploreRequest(1, 0, prompt, seeds, 0, 0, "audit"))
    latents = np.asarray(store.read_trajectory(where, request))
    again = tasks.explore_task(config, store,
                               tasks.ExploreRequest(1, 0, prompt, seeds, 0, 0, "audit"))
    np.testing.assert_array_equal(again.rewards, first.rewards)
    np.testing.assert_array_equal(np.asarray(store.read_trajectory(where, request)), latents)
    assert again.record["resumed_from"] == config.sampler.num_steps   # nothing recomputed


def test_a_stream_started_with_other_weights_is_refused(run):
    config, store, all_prompts = run
    request = tasks.ExploreRequest(1, 0, all_prompts[0], np.arange(3), 0, 0)
    tasks.explore_task(config, store, request)
    store.save_checkpoint(1, load_base_policy(config).state_dict(), None)
    with pytest.raises(RuntimeError, match="started with weights version 0, now asked for 1"):
        tasks.explore_task(config, store, dataclasses.replace(request, version=1))
