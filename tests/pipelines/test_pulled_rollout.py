"""Rollouts pulled by gpu and spot workers (placement.rollout): requests of grpo.request_prompts
prompts, the same results whatever the placement, and a placement no worker can serve refused
at start."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.front.session import Session
from pipelines.run.rollout_store import read_rollout
from spotlight.config import ConfigError, load_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _one_iteration(yaml_path, url, placement=None, mode="vanilla"):
    # One prompt per request: two requests, pulled by two workers.
    config = load_config(yaml_path, {"grpo.request_prompts": 1,
                                     **({"placement.rollout": placement} if placement else {})})
    with Session.from_config(config, store=url, mode=mode) as session:
        session.run(1)
        store = session.store
        tasks = store.get_json("iter-0/iteration", "tasks")["tasks"]
        assert not [t for t in tasks if t["stage"] == "explore"]
        rollouts = [t for t in tasks if t["stage"] == "rollout"]
        names = sorted(store.requests("iter-0/rollout"))
        latents = np.concatenate([np.asarray(store.read_trajectory("iter-0/rollout", n))
                                  for n in names], axis=1)
        return (store.get_arrays("iter-000000/reward", "reward")["rewards"],
                store.load_checkpoint(1).weights, rollouts, names,
                read_rollout(store, "iter-0/rollout")[0], latents)


def test_the_rollout_is_bit_identical_on_gpu_alone_and_pulled_by_gpu_and_spot(tiny_run_yaml,
                                                                              tmp_path):
    gpu = _one_iteration(tiny_run_yaml, str(tmp_path / "gpu"))   # one task on the gpu worker
    # Mode rlboost: random seeds, the rollout pulled by gpu and spot workers.
    both = _one_iteration(tiny_run_yaml, str(tmp_path / "both"), mode="rlboost")
    np.testing.assert_array_equal(gpu[0], both[0])   # rewards
    np.testing.assert_array_equal(gpu[4], both[4])   # log-probabilities
    np.testing.assert_array_equal(gpu[5], both[5])   # every step's latents
    assert gpu[1].keys() == both[1].keys()
    for name in gpu[1]:
        assert np.array_equal(gpu[1][name].numpy(), both[1][name].numpy()), name
    assert gpu[3] == both[3] == ["p0000", "p0001"]   # one latent stream per request
    assert np.abs(both[4]).sum() > 0 and both[5].shape[:2] == (4, 8)
    assert len(gpu[2]) == 1 and gpu[2][0]["worker"].startswith("gpu-")
    assert {t["request"] for t in both[2]} == {"p0000", "p0001"}


def test_a_placement_no_worker_can_serve_is_refused_before_the_run_store(tiny_run_yaml,
                                                                          tmp_path):
    config = load_config(tiny_run_yaml, {"placement.rollout": ["spot"], "mode": "vanilla",
                                         "cluster.spot_workers": 0})
    with pytest.raises(ConfigError, match=r"placement.rollout = \['spot'\].*no worker"):
        Session.from_config(config, store=str(tmp_path / "run"), mode="vanilla")
    assert not (tmp_path / "run").exists()


def test_preemptions_are_counted_per_kind_of_stage():
    from pipelines.bench.preemption import preemptions_by_stage

    summary = lambda n, hard, graceful: {"requests": n, "preemptions_hard": hard,  # noqa: E731
                                         "preemptions_graceful": graceful}
    found = preemptions_by_stage([
        {"stage": "iter-000001/explore", "summary": summary(8, 1, 0)},
        {"stage": "iter-000001/rollout", "summary": summary(4, 2, 1)},
        {"stage": "iter-000002/rollout", "summary": summary(4, 0, 1)}])
    assert found == {"explore": {"requests": 8, "hard": 1, "graceful": 0},
                     "rollout": {"requests": 8, "hard": 2, "graceful": 2}}


def test_spotlight_pulls_the_rollout_and_explores_in_the_training_window(tiny_run_yaml,
                                                                          tmp_path):
    config = load_config(tiny_run_yaml, {"placement.rollout": []})   # the mode's default
    assert config.placed("rollout") == ("gpu", "spot") and config.placed("explore") == ("spot",)
    with Session.from_config(config, store=str(tmp_path / "run"), mode="spotlight") as session:
        session.run(2)   # iteration 0 explores for iteration 1
        tasks = session.store.get_json("iter-0/iteration", "tasks")["tasks"]
        assert session.store.stage_record("iter-0/rollout")["info"]["dispatch"]["requests"] == 1
    rollout_end = max(t["end"] for t in tasks if t["stage"] == "rollout")
    explores = [t for t in tasks if t["stage"] == "explore"]
    assert explores and min(t["start"] for t in explores) >= rollout_end
