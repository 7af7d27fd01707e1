"""The forward-process trainer: picked by objective.kind, deterministic, and learning."""
import numpy as np
import pytest
import torch

from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import load_prompts
from spotlight.rewards import check_rewards
from spotlight.rl.grpo import group_advantages
from spotlight.rl.objectives import ForwardProcessTrainer, build_trainer
from spotlight.rl.trainer import FlowGRPO, random_seeds
from tests.rl.loop import assert_old_velocities_are, reward_before_and_after, sample_group, update
from tests.rl.test_trainer import brightness


@pytest.fixture
def nft_config(tiny_config):
    return tiny_config.with_values({"objective.kind": "nft", "grpo.lr": 3e-3,
                                    "grpo.beta_kl": 0.0, "grpo.micro_batch": 8})


def test_the_objective_kind_picks_the_trainer(tiny_config, nft_config):
    policy = DigitsPolicy(tiny_config.model, 12, 32)
    assert type(build_trainer(tiny_config, policy, brightness, check_rewards)) is FlowGRPO
    assert type(build_trainer(nft_config, policy, brightness, check_rewards)) is \
        ForwardProcessTrainer


def test_the_first_step_starts_at_the_sampling_policy_and_moves_it(nft_config):
    """One micro-batch: v is v_old (drift 0), and the step changes the weights; the same
    iteration from the same weights trains identically."""
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        policy = DigitsPolicy(nft_config.model, 12, 32)
        before = {k: v.clone() for k, v in policy.state_dict().items()}
        trainer = ForwardProcessTrainer(nft_config, policy, brightness, check_rewards)
        stats, _ = update(trainer, 0, prompts, random_seeds(0, 0, 2, 4))
        assert stats.approx_kl == 0.0 and stats.loss > 0.0
        assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
        results.append(policy.state_dict())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_nft_leaves_zero_spread_groups_untrained(nft_config):
    policy = DigitsPolicy(nft_config.model, 12, 32)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer = build_trainer(nft_config, policy, lambda im, p: np.full(len(p), 0.5), check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    stats, _ = update(trainer, 0, prompts, random_seeds(0, 0, 2, 4))
    assert stats.zero_std_groups == 2 and stats.loss == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_nft_raises_a_simple_reward(nft_config):
    torch.manual_seed(0)
    trainer = build_trainer(nft_config, DigitsPolicy(nft_config.model, 12, 32), brightness,
                            check_rewards)
    before, after, stats = reward_before_and_after(
        trainer, load_prompts("configs/prompts/ocr_train.txt", "ocr"))
    assert all(np.isfinite(s.loss) for s in stats)
    assert after > before + 0.02, (before, after)


def test_v_old_is_the_sampling_policys_velocity_and_only_later_rows_need_a_pass_of_their_own(
        nft_config):
    """Two micro-batches, two epochs: every row's v_old is the velocity of the weights the
    rollout was sampled with (the first micro-batch's from its own training pass, the second's
    from a pass before the first step), and only the second micro-batch's rows were run
    without gradient for it."""
    config = nft_config.with_values({"grpo.micro_batch": 4, "grpo.inner_epochs": 2})
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    torch.manual_seed(0)
    policy = DigitsPolicy(config.model, 12, 32)
    sampling = DigitsPolicy(config.model, 12, 32)
    sampling.load_state_dict(policy.state_dict())
    trainer = ForwardProcessTrainer(config, policy, brightness, check_rewards)
    rollout = sample_group(trainer, prompts, random_seeds(0, 0, 2, 4))
    advantages = group_advantages(rollout.rewards, global_std=False, clip=5.0)
    assert advantages.kept.all()
    rows_without_grad = []
    velocity = policy.velocity

    def counted(x, sigma, text):
        if not torch.is_grad_enabled():
            rows_without_grad.append(len(x))
        return velocity(x, sigma, text)

    policy.velocity = counted
    trainer.train(rollout, advantages, 0)
    assert sum(rows_without_grad) == 4 * len(trainer.sigmas)   # 4 rows at each noise level
    assert bool(trainer.old_known.all())
    assert_old_velocities_are(sampling, trainer, rollout)
