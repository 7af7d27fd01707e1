"""The forward-process (DiffusionNFT) objective: its math on hand-computed cases, and its trainer."""
import numpy as np
import pytest
import torch

from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import load_prompts
from spotlight.rewards import check_rewards
from spotlight.rl.nft import noised, nft_loss, optimality, training_noise, training_sigmas
from spotlight.rl.objectives import ForwardProcessTrainer, build_trainer
from spotlight.rl.trainer import FlowGRPO, iteration_prompts, random_seeds
from tests.rl.test_trainer import brightness


def test_optimality_maps_the_clipped_advantage_onto_zero_to_one():
    got = optimality(np.array([-7.0, -5.0, 0.0, 2.5, 10.0]), clip=5.0)
    assert got.tolist() == [0.0, 0.0, 0.5, 0.75, 1.0]


def test_training_sigmas_take_one_level_from_each_slice_and_repeat_per_iteration():
    sigmas = training_sigmas(3, 7, 4, 0.2)
    width = 0.8 / 4
    assert all(0.2 + j * width <= s < 0.2 + (j + 1) * width for j, s in enumerate(sigmas))
    assert sigmas == training_sigmas(3, 7, 4, 0.2) != training_sigmas(3, 8, 4, 0.2)


def test_a_rows_noise_does_not_depend_on_how_many_rows_are_drawn():
    whole = training_noise(0, 2, 6, 3, (5, 2))
    assert whole.shape == (6, 3, 5, 2)
    assert torch.equal(training_noise(0, 2, 4, 3, (5, 2)), whole[:4])
    assert not torch.equal(whole[0], whole[1])


def test_noised_mixes_data_and_noise_and_targets_their_difference():
    x, target = noised(torch.tensor([[1.0]]), torch.tensor([[3.0]]), 0.25)
    assert x.item() == pytest.approx(0.75 * 1.0 + 0.25 * 3.0)
    assert target.item() == pytest.approx(2.0)


def test_nft_loss_on_a_hand_computed_case():
    # v+ = 0.5 v = [0.5, 1]: squared errors to [1, 1] are 0.25, 0 -> mean 0.125.
    # v- = -0.5 v = [-0.5, -1]: 2.25, 4 -> mean 3.125.   0.75 * 0.125 + 0.25 * 3.125 = 0.875.
    loss = nft_loss(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2), torch.ones(1, 2),
                    torch.tensor([0.75]), beta=0.5)
    assert loss.tolist() == pytest.approx([0.875])


@pytest.mark.parametrize("r", [0.0, 0.5, 0.9, 1.0])
def test_at_the_sampling_policy_the_gradient_is_2b_2r_minus_1_times_the_error(r):
    """At v = v_old, d loss / d v = 2 b (2r - 1) (v - v*) / n: toward the target for a good
    sample, away for a bad one, nothing at r = 1/2."""
    beta, old, target = 0.3, torch.tensor([[0.2, -1.0, 0.5]]), torch.tensor([[1.0, 0.0, 0.5]])
    v = old.clone().requires_grad_(True)
    nft_loss(v, old, target, torch.tensor([r]), beta).sum().backward()
    expected = 2 * beta * (2 * r - 1) * (old - target) / 3
    assert torch.allclose(v.grad, expected, atol=1e-7)


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
    """One micro-batch: v equals the precomputed v_old (drift 0), and the step changes the
    weights; the same iteration from the same weights trains identically."""
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        policy = DigitsPolicy(nft_config.model, 12, 32)
        before = {k: v.clone() for k, v in policy.state_dict().items()}
        trainer = ForwardProcessTrainer(nft_config, policy, brightness, check_rewards)
        stats, _ = trainer.iteration(0, prompts, random_seeds(0, 0, 2, 4))
        assert stats.approx_kl == 0.0 and stats.loss > 0.0
        assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
        results.append(policy.state_dict())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_nft_leaves_zero_spread_groups_untrained(nft_config):
    policy = DigitsPolicy(nft_config.model, 12, 32)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer = build_trainer(nft_config, policy, lambda im, p: np.full(len(p), 0.5), check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")[:2]
    stats, _ = trainer.iteration(0, prompts, random_seeds(0, 0, 2, 4))
    assert stats.zero_std_groups == 2 and stats.loss == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_nft_raises_a_simple_reward(nft_config):
    torch.manual_seed(0)
    trainer = build_trainer(nft_config, DigitsPolicy(nft_config.model, 12, 32), brightness,
                            check_rewards)
    prompts = load_prompts("configs/prompts/ocr_train.txt", "ocr")
    probe_seeds = random_seeds(99, 0, 2, 4)
    before = trainer.rollout(prompts[:2], probe_seeds).rewards.mean()
    for k in range(8):
        stats, _ = trainer.iteration(k, iteration_prompts(prompts, k, 2, 0),
                                     random_seeds(0, k, 2, 4))
        assert np.isfinite(stats.loss)
    after = trainer.rollout(prompts[:2], probe_seeds).rewards.mean()
    assert after > before + 0.02, (before, after)
