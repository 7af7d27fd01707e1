"""The forward-process (DiffusionNFT) objective's math on hand-computed cases (the trainer:
test_nft_trainer.py)."""
import numpy as np
import pytest
import torch

from spotlight.rl.nft import nft_loss, noised, optimality, training_noise, training_sigmas


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
