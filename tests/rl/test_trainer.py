import numpy as np
import pytest
import torch

from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import load_prompts
from spotlight.rewards import check_rewards
from spotlight.rl.trainer import FlowGRPO, iteration_prompts, random_seeds
from tests.rl.loop import sample_group, update


def brightness(images, prompts):
    """A reward with a known optimum (bright canvases), to test the optimiser, not the world."""
    return images.mean(axis=(1, 2, 3)).astype(np.float64)


@pytest.fixture
def trainer(tiny_config):
    torch.manual_seed(0)
    config = tiny_config.with_values({"grpo.lr": 3e-3, "grpo.beta_kl": 0.0})
    policy = DigitsPolicy(config.model, 12, 32)
    return FlowGRPO(config, policy, brightness, check_rewards)


def test_grpo_raises_a_simple_reward(trainer):
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")
    probe_prompts = prompts[:2]
    probe_seeds = random_seeds(99, 0, 2, 4)
    before = sample_group(trainer, probe_prompts, probe_seeds).rewards.mean()
    for k in range(8):
        chosen = iteration_prompts(prompts, k, 2, 0)
        stats, _ = update(trainer, k, chosen, random_seeds(0, k, 2, 4))
        assert stats.groups == 2 and np.isfinite(stats.loss)
    after = sample_group(trainer, probe_prompts, probe_seeds).rewards.mean()
    assert after > before + 0.02, (before, after)


def test_kl_to_reference_is_zero_before_any_update_and_grows_after(tiny_config):
    torch.manual_seed(0)
    # micro_batch 8: one update per iteration, so the first sees the reference weights
    tiny_config = tiny_config.with_values({"grpo.beta_kl": 0.1, "grpo.micro_batch": 8})
    trainer = FlowGRPO(tiny_config, DigitsPolicy(tiny_config.model, 12, 32), brightness,
                       check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    first, _ = update(trainer, 0, prompts, random_seeds(0, 0, 2, 4))
    second, _ = update(trainer, 1, prompts, random_seeds(0, 1, 2, 4))
    assert first.kl_to_reference < 1e-6 < second.kl_to_reference


def test_zero_spread_groups_are_dropped_and_counted(tiny_config):
    policy = DigitsPolicy(tiny_config.model, 12, 32)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer = FlowGRPO(tiny_config, policy, lambda im, p: np.full(len(p), 0.5), check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    stats, _ = update(trainer, 0, prompts, random_seeds(0, 0, 2, 4))
    assert stats.zero_std_groups == 2 and stats.loss == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_rewards_are_refused_before_any_update(tiny_config, bad):
    policy = DigitsPolicy(tiny_config.model, 12, 32)
    before = {k: v.clone() for k, v in policy.state_dict().items()}

    def broken(images, prompts):
        out = np.linspace(0, 1, len(prompts))
        out[3] = bad
        return out

    trainer = FlowGRPO(tiny_config, policy, broken, check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    with pytest.raises(ValueError, match=r"rollout: rewards of samples \[3:"):
        update(trainer, 0, prompts, random_seeds(0, 0, 2, 4))
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_the_decayed_learning_rate_is_the_one_the_optimizer_steps_with(trainer):
    trainer.config = trainer.config.with_values({"grpo.lr_decay_iterations": 4,
                                                 "grpo.lr_min_fraction": 0.25})
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    seen = []
    for k in (0, 2, 6):
        update(trainer, k, prompts, random_seeds(0, k, 2, 4))
        seen.append(trainer.optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([3e-3, 3e-3 * 0.625, 3e-3 * 0.25])
