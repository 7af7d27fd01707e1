import numpy as np
import pytest
import torch

from spotlight.models.prompts import Prompt
from spotlight.rl.grpo import group_advantages, learning_rate, ppo_clipped_loss
from spotlight.rl.trainer import iteration_prompts, random_seeds


def test_group_advantages_standardise_per_prompt_and_drop_flat_groups():
    rewards = np.array([[0.0, 1.0, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]])
    adv = group_advantages(rewards)
    assert adv.dropped == 1 and adv.kept.tolist() == [True, False]
    assert np.allclose(adv.values[1], 0.0)
    assert adv.values[0].mean() == pytest.approx(0.0, abs=1e-12)
    assert adv.values[0].std() == pytest.approx(1.0, rel=1e-6)
    assert adv.values[0][1] > 0 > adv.values[0][0]


def test_global_std_uses_the_batch_spread():
    rewards = np.array([[0.0, 0.2], [0.0, 1.0]])
    adv = group_advantages(rewards, global_std=True)
    assert adv.values[0, 1] == pytest.approx(0.1 / rewards.std())
    assert abs(adv.values[0, 1]) < abs(adv.values[1, 1])


def test_advantages_are_clipped_and_shape_is_checked():
    rewards = np.array([[0.0] * 99 + [1.0]])
    assert group_advantages(rewards, clip=2.0).values.max() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="prompts, group"):
        group_advantages(np.array([0.1, 0.2]))


def test_ppo_loss_clips_the_ratio_in_the_direction_of_the_advantage():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_clipped_loss(new, old, adv, clip_range=0.2)
    # Positive advantage: ratio 1.5 is clipped to 1.2; negative: ratio 0.5 clipped to 0.8.
    assert loss.tolist() == pytest.approx([-1.2, 0.8])
    assert stats["clip_fraction"] == 1.0
    same, _ = ppo_clipped_loss(old, old, adv, 0.2)
    assert same.tolist() == pytest.approx([-1.0, 1.0])


def test_ppo_ratio_is_new_over_old_probability_and_its_diagnostics_are_exact():
    old = torch.log(torch.tensor([0.5, 0.5, 0.2, 0.4]))
    new = torch.log(torch.tensor([0.55, 0.25, 0.2, 0.6]))   # ratios 1.1, 0.5, 1.0, 1.5
    adv = torch.tensor([2.0, 1.0, -3.0, -1.0])
    loss, stats = ppo_clipped_loss(new, old, adv, clip_range=0.2)
    # Inside the range the ratio acts unclipped (-2 * 1.1); a positive advantage below the
    # range keeps the smaller ratio (-1 * 0.5: clipping must not raise the objective); a
    # negative one above it keeps the larger (+1 * 1.5).
    assert loss.tolist() == pytest.approx([-2.2, -0.5, 3.0, 1.5])
    assert stats["clip_fraction"] == pytest.approx(0.5)        # 0.5 and 1.5 lie outside 1 +- 0.2
    log_ratio = (new - old).numpy()
    assert stats["approx_kl"] == pytest.approx(0.5 * float((log_ratio ** 2).mean()))
    at_the_edge, edge_stats = ppo_clipped_loss(torch.log(torch.tensor([1.25])), torch.zeros(1),
                                               torch.tensor([1.0]), clip_range=0.25)
    assert edge_stats["clip_fraction"] == 0.0   # exactly on the edge is not clipped
    assert at_the_edge.tolist() == pytest.approx([-1.25])


def test_negative_advantages_are_clipped_too_and_the_spread_is_reported():
    rewards = np.array([[1.0] * 99 + [0.0], [0.0, 1.0] * 50])
    adv = group_advantages(rewards, clip=2.0)
    assert adv.values.min() == pytest.approx(-2.0)
    assert adv.group_std.tolist() == pytest.approx([rewards[0].std(), 0.5])


def test_iteration_prompts_cycle_through_the_file_deterministically():
    prompts = [Prompt(text=str(i), task="ocr", target=str(i)) for i in range(5)]
    first_epoch = [p.text for k in range(5) for p in iteration_prompts(prompts, k, 1, run_seed=0)]
    assert sorted(first_epoch) == [str(i) for i in range(5)]
    assert iteration_prompts(prompts, 3, 2, 0) == iteration_prompts(prompts, 3, 2, 0)
    assert (random_seeds(0, 1, 2, 3) == random_seeds(0, 1, 2, 3)).all()
    assert not (random_seeds(0, 1, 2, 3) == random_seeds(0, 2, 2, 3)).all()


def test_learning_rate_decays_linearly_then_holds():
    assert learning_rate(2e-4, 37, 0, 0.1) == 2e-4                  # no decay configured
    assert learning_rate(1.0, 1, 1, 0.5) == 0.5                      # decayed in one iteration
    assert learning_rate(2e-4, 0, 50, 0.1) == pytest.approx(2e-4)
    assert learning_rate(2e-4, 25, 50, 0.1) == pytest.approx(1.1e-4)  # halfway to 0.2e-4
    assert learning_rate(2e-4, 50, 50, 0.1) == pytest.approx(0.2e-4)
    assert learning_rate(2e-4, 500, 50, 0.1) == pytest.approx(0.2e-4)
    rates = [learning_rate(1.0, k, 10, 0.0) for k in range(12)]
    assert all(a > b for a, b in zip(rates[:10], rates[1:11])) and rates[10] == rates[11] == 0.0
