"""Advantage Weighted Matching's math on hand-computed cases, and its trainer learning."""
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import load_prompts
from spotlight.rewards import check_rewards
from spotlight.rl.awm import awm_sigmas, matching_log_likelihood
from spotlight.rl.grpo import ppo_clipped_loss
from spotlight.rl.objectives import AdvantageWeightedTrainer, build_trainer
from tests.rl.loop import reward_before_and_after
from tests.rl.test_trainer import brightness


def test_the_likelihood_is_minus_the_mean_squared_error_to_noise_minus_data():
    # v = [1, 2] against a target [0, 0]: squared errors 1 and 4, mean 2.5.
    got = matching_log_likelihood(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2))
    assert got.tolist() == [-2.5]


def test_at_the_sampling_policy_the_gradient_is_the_advantage_times_the_matching_gradient():
    """Ratio 1: the loss is -A, and its gradient in v is A x d/dv mean |v - t|^2 = A (v - t)
    (two elements: 2 (v - t) / 2)."""
    v = torch.tensor([[1.0, 2.0], [1.0, 2.0]], requires_grad=True)
    target = torch.zeros(2, 2)
    adv = torch.tensor([2.0, -0.5])
    ll = matching_log_likelihood(v, target)
    loss, stats = ppo_clipped_loss(ll, ll.detach(), adv, clip_range=1e-4)
    assert loss.tolist() == [-2.0, 0.5] and stats["clip_fraction"] == 0.0
    loss.sum().backward()
    assert v.grad.tolist() == [[2.0, 4.0], [-0.5, -1.0]]


def test_noise_levels_take_one_logit_normal_quantile_slice_each_and_shift_toward_noise():
    sigmas = awm_sigmas(3, 7, 4, shift=1.0)
    bounds = [1 / (1 + math.exp(-NormalDist().inv_cdf(q))) if 0 < q < 1 else q
              for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert all(bounds[j] <= s < bounds[j + 1] for j, s in enumerate(sigmas)), sigmas
    assert sigmas == awm_sigmas(3, 7, 4, 1.0) != awm_sigmas(3, 8, 4, 1.0)
    shifted = awm_sigmas(3, 7, 4, shift=3.0)
    assert shifted == pytest.approx([3 * s / (1 + 2 * s) for s in sigmas])
    assert all(b > a for a, b in zip(sigmas, shifted))


@pytest.fixture
def awm_config(tiny_config):
    return tiny_config.with_values({"objective.kind": "awm", "grpo.lr": 3e-3,
                                    "grpo.beta_kl": 0.0, "grpo.micro_batch": 8})


def test_the_objective_kind_picks_awm(awm_config):
    policy = DigitsPolicy(awm_config.model, 12, 32)
    assert type(build_trainer(awm_config, policy, brightness, check_rewards)) is \
        AdvantageWeightedTrainer


def test_awm_raises_a_simple_reward(awm_config):
    torch.manual_seed(0)
    trainer = build_trainer(awm_config, DigitsPolicy(awm_config.model, 12, 32), brightness,
                            check_rewards)
    before, after, stats = reward_before_and_after(
        trainer, load_prompts("configs/prompts/ocr_train.txt", "ocr"))
    # One micro-batch an iteration: every update starts at the sampling policy.
    assert all(np.isfinite(s.loss) and s.approx_kl == 0.0 for s in stats)
    assert after > before + 0.02, (before, after)
