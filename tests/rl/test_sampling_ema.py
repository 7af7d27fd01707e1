"""The soft update of the sampling policy (objective.sampling_ema): the run samples with a
moving average phi of the weights theta the optimizer steps, and a resumed trainer continues
exactly."""
import pytest
import torch

from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import load_prompts
from spotlight.rewards import check_rewards
from spotlight.rl.grpo import group_advantages
from spotlight.rl.nft import sampling_decay, soft_update_
from spotlight.rl.objectives import TRAINED_WEIGHTS, ForwardProcessTrainer
from spotlight.rl.trainer import random_seeds
from storage.checkpoints import flatten_state, unflatten_state
from tests.rl.loop import assert_old_velocities_are, sample_group
from tests.rl.test_trainer import brightness


def test_the_soft_update_moves_phi_a_share_of_the_way_to_theta():
    phi, theta = [torch.zeros(3), torch.ones(2)], [torch.ones(3), torch.full((2,), 3.0)]
    soft_update_(phi, theta, 0.25)
    torch.testing.assert_close(phi[0], torch.full((3,), 0.75))
    torch.testing.assert_close(phi[1], torch.full((2,), 2.5))   # 0.25 * 1 + 0.75 * 3
    soft_update_(phi, theta, 0.0)
    assert torch.equal(phi[1], theta[1])   # decay 0: phi is theta


def test_the_decay_ramps_linearly_then_holds():
    assert sampling_decay(0.5, 0, 0) == 0.5
    assert [sampling_decay(0.5, 4, k) for k in range(6)] == [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]


def test_flow_grpo_samples_with_the_weights_it_steps(tiny_config):
    """The soft update is a forward-process objective's setting (as nft_beta is): Flow-GRPO's
    ratios need the sampled steps' log-probabilities under the weights it steps, so its trainer
    leaves the setting unread and a bench's one --set serves every mode."""
    from spotlight.rl.objectives import build_trainer

    config = tiny_config.with_values({"objective.kind": "flow-grpo",
                                      "objective.sampling_ema": 0.5})
    trainer = build_trainer(config, DigitsPolicy(config.model, 12, 32), brightness, check_rewards)
    assert not isinstance(trainer, ForwardProcessTrainer)


@pytest.fixture
def ema_config(tiny_config):
    return tiny_config.with_values({"objective.kind": "nft", "grpo.lr": 3e-3,
                                    "grpo.beta_kl": 0.0, "grpo.micro_batch": 8,
                                    "objective.sampling_ema": 0.5})


def _step(trainer, prompts, iteration):
    rollout = sample_group(trainer, prompts, random_seeds(0, iteration, 2, 4))
    advantages = group_advantages(rollout.rewards, global_std=False, clip=5.0)
    return trainer.train(rollout, advantages, iteration)


def test_the_policy_holds_the_average_and_the_trainer_the_stepped_weights(tiny_config,
                                                                          ema_config):
    """From equal weights, the first step of theta is the on-policy trainer's step; the policy
    is then left at the average of the start and theta, which the trainer keeps aside."""
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    stepped = {}
    for name, config in (("on-policy", ema_config.with_values({"objective.sampling_ema": 0.0})),
                         ("soft", ema_config)):
        torch.manual_seed(0)
        policy = DigitsPolicy(config.model, 12, 32)
        trainer = ForwardProcessTrainer(config, policy, brightness, check_rewards)
        start = [p.detach().clone() for p in trainer.parameters]
        _step(trainer, prompts, 0)
        stepped[name] = (start, trainer, [p.detach().clone() for p in trainer.parameters])
    start, soft, phi = stepped["soft"]
    theta = stepped["on-policy"][2]
    assert soft.trained is not None
    for t_soft, t_on in zip(soft.trained, theta):
        torch.testing.assert_close(t_soft, t_on, rtol=1e-5, atol=1e-7)
    for p, s, t in zip(phi, start, soft.trained):
        torch.testing.assert_close(p, 0.5 * s + 0.5 * t)
    assert any(not torch.equal(p, t) for p, t in zip(phi, soft.trained))


def test_a_trainer_resumed_from_its_saved_state_steps_as_the_uninterrupted_one(ema_config):
    """Two iterations in one trainer against one iteration, a save (through the checkpoint's
    state format) and a fresh trainer for the second: the same phi and theta, bit for bit."""
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    torch.manual_seed(0)
    base = DigitsPolicy(ema_config.model, 12, 32).state_dict()

    def trainer_from(weights, state=None):
        policy = DigitsPolicy(ema_config.model, 12, 32)
        policy.load_state_dict(weights)
        trainer = ForwardProcessTrainer(ema_config, policy, brightness, check_rewards)
        trainer.load_training_state(state)
        return trainer

    whole = trainer_from(base)
    for k in range(2):
        _step(whole, prompts, k)
    first = trainer_from(base)
    _step(first, prompts, 0)
    tensors, skeleton = flatten_state(first.training_state())
    saved = unflatten_state(skeleton, {k: v.clone() for k, v in tensors.items()})
    assert TRAINED_WEIGHTS in saved
    resumed = trainer_from({k: v.clone() for k, v in first.policy.state_dict().items()}, saved)
    _step(resumed, prompts, 1)
    for a, b in zip(whole.parameters, resumed.parameters):
        assert torch.equal(a, b)
    for a, b in zip(whole.trained, resumed.trained):
        assert torch.equal(a, b)


def test_v_old_is_the_averaged_sampling_policys_velocity(ema_config):
    """At the second step phi and theta differ: every row's v_old is phi's velocity (the
    weights the rollout sampled with), not that of the weights being stepped."""
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    torch.manual_seed(0)
    trainer = ForwardProcessTrainer(ema_config, DigitsPolicy(ema_config.model, 12, 32),
                                    brightness, check_rewards)
    _step(trainer, prompts, 0)
    sampling = DigitsPolicy(ema_config.model, 12, 32)
    sampling.load_state_dict(trainer.policy.state_dict())   # phi_1, what the policy holds
    rollout = sample_group(trainer, prompts, random_seeds(0, 1, 2, 4))
    trainer.train(rollout, group_advantages(rollout.rewards, global_std=False, clip=5.0), 1)
    assert_old_velocities_are(sampling, trainer, rollout)
