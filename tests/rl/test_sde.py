import math

import pytest
import torch

from spotlight.config import SamplerConfig
from spotlight.models.policy import DigitsPolicy
from spotlight.rl.noise import SampleKey, batch_noise
from spotlight.rl.sampler import (
    sample,
    step_grid,
    step_kinds,
    trainable_steps,
    transition_distribution,
)
from spotlight.rl.sde import (
    cps_step,
    flow_sde_step,
    gaussian_log_prob,
    kl_to_reference,
    ode_step,
    sigma_schedule,
)


@pytest.fixture
def policy(tiny_model_config):
    torch.manual_seed(0)
    return DigitsPolicy(tiny_model_config, 12, 32).eval()


def keys(n, run_seed=3):
    return [SampleKey(run_seed, 100 + i, 7 * i) for i in range(n)]


def test_flow_sde_step_mean_and_std_match_the_formula():
    x, v = torch.tensor([[0.5, -1.0]]), torch.tensor([[2.0, 0.25]])
    sigma, nxt, a = 0.6, 0.4, 0.7
    dist = flow_sde_step(x, v, sigma, nxt, a, sigma_cap=0.9)
    dt = nxt - sigma
    std_t = a * math.sqrt(sigma / (1 - sigma))
    mean = (x * (1 + std_t**2 / (2 * sigma) * dt)
            + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt)
    assert torch.allclose(dist.mean, mean, atol=1e-7)
    assert dist.std.item() == pytest.approx(std_t * math.sqrt(-dt), rel=1e-6)


def test_flow_sde_first_step_uses_the_capped_sigma():
    dist = flow_sde_step(torch.zeros(1, 2), torch.zeros(1, 2), 1.0, 0.9, 0.7, sigma_cap=0.9)
    assert math.isfinite(dist.std.item())
    assert dist.std.item() == pytest.approx(0.7 * math.sqrt(1.0 / 0.1) * math.sqrt(0.1), rel=1e-6)


def test_flow_sde_without_noise_is_the_euler_ode_step():
    x, v = torch.randn(3, 4), torch.randn(3, 4)
    sde = flow_sde_step(x, v, 0.5, 0.3, 0.0, sigma_cap=0.9)
    ode = ode_step(x, v, 0.5, 0.3)
    assert torch.allclose(sde.mean, ode.mean, atol=1e-7)
    assert torch.allclose(ode.mean, x - 0.2 * v, atol=1e-7)


def test_cps_step_preserves_coefficients_and_ends_deterministic():
    x, v = torch.randn(2, 3), torch.randn(2, 3)
    sigma, nxt, a = 0.5, 0.25, 0.7
    dist = cps_step(x, v, sigma, nxt, a)
    std = nxt * math.sin(a * math.pi / 2)
    expected = (x - sigma * v) * (1 - nxt) + (x + (1 - sigma) * v) * math.sqrt(nxt**2 - std**2)
    assert torch.allclose(dist.mean, expected, atol=1e-6)
    assert dist.std[0].item() == pytest.approx(std)
    assert cps_step(x, v, 0.1, 0.0, a).std.abs().max().item() == 0.0


def test_gaussian_log_prob_matches_the_density():
    mean, std = torch.zeros(1, 4), torch.tensor([0.5])
    from spotlight.rl.sde import StepDistribution
    value = torch.tensor([[0.5, -0.5, 0.0, 1.0]])
    got = gaussian_log_prob(value, StepDistribution(mean, std))
    want = torch.distributions.Normal(0.0, 0.5).log_prob(value).mean()
    assert got.item() == pytest.approx(want.item(), abs=1e-6)


@pytest.mark.parametrize("sde_type", ["flow", "cps"])
def test_recomputed_log_prob_matches_sampling_time(policy, sde_type):
    config = SamplerConfig(num_steps=4, sde_type=sde_type)
    prompts = ['a sign that says "12"', 'a sign that says "7"', 'a poster with the text "345"']
    traj = sample(policy, prompts, keys(3), config, mode="sde")
    text = policy.encode(prompts)
    assert traj.trainable_steps, "an SDE rollout must have trainable steps"
    for t in traj.trainable_steps:
        dist = transition_distribution(policy, traj.latents, t, traj.sigmas, text, config)
        recomputed = gaussian_log_prob(traj.latents[:, t + 1], dist)
        assert torch.allclose(recomputed, traj.log_probs[:, t], atol=1e-5)
        assert kl_to_reference(dist, dist.mean).abs().max().item() == 0.0


def test_sampling_is_deterministic_per_sample_and_resumable(policy):
    config = SamplerConfig(num_steps=5)
    prompts = ['a sign that says "12"', 'a sign that says "98"']
    first = sample(policy, prompts, keys(2), config)
    again = sample(policy, prompts, keys(2), config)
    assert torch.equal(first.final, again.final)
    # Resuming from a committed step gives bit-identical output.
    resumed = sample(policy, prompts, keys(2), config, start_step=3,
                     start_latents=first.latents[:, 3])
    assert torch.equal(resumed.final, first.final)
    other_seed = sample(policy, prompts, keys(2, run_seed=4), config)
    assert not torch.allclose(other_seed.final, first.final)


def test_noise_of_a_sample_does_not_depend_on_its_batch():
    k = keys(3)
    alone = batch_noise(k[1:2], 2, (4, 12))
    together = batch_noise(k, 2, (4, 12))
    assert torch.equal(alone[0], together[1])
    assert not torch.equal(together[0], together[1])


def test_sde_window_limits_stochastic_and_trained_steps():
    config = SamplerConfig(num_steps=6, sde_window_start=2, sde_window_size=2)
    assert step_kinds(config) == ["ode", "ode", "flow", "flow", "ode", "ode"]
    assert trainable_steps(config) == [2, 3]
    assert trainable_steps(config, mode="ode") == []
    assert trainable_steps(SamplerConfig(num_steps=3, sde_type="cps")) == [0, 1]


def test_sigma_schedule_runs_from_noise_to_data():
    s = sigma_schedule(10, shift=3.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and bool((s[1:] < s[:-1]).all())


def test_a_shorter_replay_keeps_the_sde_window_and_compresses_only_the_tail(policy):
    config = SamplerConfig(num_steps=8, sde_window_start=0, sde_window_size=3)
    full, short = step_grid(config), step_grid(config, num_steps=5)
    assert torch.equal(short.sigmas[:4], full.sigmas[:4]) and short.sigmas[-1] == 0.0
    assert len(short.sigmas) == 6 and bool((short.sigmas[1:] < short.sigmas[:-1]).all())
    assert short.kinds == ["flow"] * 3 + ["ode"] * 2 and short.trainable == [0, 1, 2]
    prompts = ['a sign that says "12"', 'a sign that says "98"']
    rollout = sample(policy, prompts, keys(2), config)
    replay = sample(policy, prompts, keys(2), config, num_steps=5)
    # Every step a seed decides is the rollout's own, bit for bit; only the tail differs.
    assert torch.equal(replay.latents[:, :4], rollout.latents[:, :4])
    assert replay.latents.shape[1] == 6 and not torch.equal(replay.final, rollout.final)


def test_a_replay_too_short_for_the_window_coarsens_the_whole_grid():
    config = SamplerConfig(num_steps=8, sde_window_start=0, sde_window_size=4)
    coarse = step_grid(config, num_steps=4)
    assert torch.allclose(coarse.sigmas, sigma_schedule(4)) and coarse.kinds == ["flow"] * 4
    assert step_grid(config, num_steps=8).kinds == step_kinds(config)


def test_a_two_step_window_samples_euler_ode_steps_outside_it(policy):
    """Flow-GRPO-Fast's rollout: noise and log-probabilities only inside the window; every
    other step is x + v (sigma' - sigma) exactly, so a trainer sees nothing to train there."""
    config = SamplerConfig(num_steps=5, sde_window_start=0, sde_window_size=2)
    prompts = ["12", "345"]
    traj = sample(policy, prompts, keys(2), config, mode="sde")
    assert traj.trainable_steps == [0, 1]
    assert (traj.log_probs[:, :2] != 0).all() and (traj.log_probs[:, 2:] == 0).all()
    text = policy.encode(prompts)
    with torch.no_grad():
        for t in (2, 3, 4):
            x, sigma, after = traj.latents[:, t], traj.sigmas[t], traj.sigmas[t + 1]
            v = policy.velocity(x, traj.sigmas[t:t + 1], text)
            assert torch.allclose(traj.latents[:, t + 1], x + v * (after - sigma), atol=1e-6)
