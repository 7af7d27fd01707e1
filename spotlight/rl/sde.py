"""The SDE step of Flow-GRPO with its log-probability: the whole RL-specific change to a sampler.

Pure functions of tensors, computed in fp32, apart from the model and from any scheduler
object. Sigma runs from 1 (noise) to 0 (data); the model predicts velocity v = noise - data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class StepDistribution:
    """Gaussian over the next latent: ``mean`` and a per-sample scalar ``std`` (0 = deterministic).

    ``scale`` is that std as a host number (every sample's is the same): whether a step is
    deterministic is known without reading the device."""

    mean: torch.Tensor
    std: torch.Tensor  # (B,) broadcastable after view, on the mean's device
    scale: float | None = None

    @property
    def deterministic(self) -> bool:
        return self.scale == 0.0 if self.scale is not None else float(self.std.max()) == 0.0


def sigma_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """``num_steps + 1`` sigmas from 1 to 0, time-shifted as in SD3 / Qwen-Image."""
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    s = shift * s / (1 + (shift - 1) * s)
    return s.float()


def _bview(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def flow_sde_step(sample: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float,
                  noise_level: float, sigma_cap: float) -> StepDistribution:
    """Flow-GRPO's SDE (the reverse SDE that shares the ODE's marginals).

    std_t = a * sqrt(sigma / (1 - sigma)); sigma = 1 is replaced by ``sigma_cap`` (the schedule's
    second sigma) inside the square root so the first step stays finite.
        mean = x (1 + std_t^2 / (2 sigma) dt) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt
        x'   = mean + std_t sqrt(-dt) eps
    """
    x, v = sample.float(), velocity.float()
    dt = sigma_next - sigma
    denominator = 1.0 - (sigma_cap if sigma >= 1.0 else sigma)
    std_t = noise_level * math.sqrt(sigma / denominator)
    mean = (x * (1 + std_t**2 / (2 * sigma) * dt)
            + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt)
    scale = std_t * math.sqrt(-dt)
    std = torch.full((x.shape[0],), scale, dtype=torch.float32, device=x.device)
    return StepDistribution(mean, std, scale)


def cps_step(sample: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float,
             noise_level: float) -> StepDistribution:
    """Coefficients-preserving sampling: re-noise the predicted data at exactly sigma_next.

    std = sigma_next * sin(a * pi / 2); the predicted noise keeps the rest of the variance, so the
    marginal coefficients match the forward process. The last step (sigma_next = 0) is
    deterministic.
    """
    x, v = sample.float(), velocity.float()
    std_t = sigma_next * math.sin(noise_level * math.pi / 2)
    data = x - sigma * v
    noise = x + (1 - sigma) * v
    mean = data * (1 - sigma_next) + noise * math.sqrt(max(sigma_next**2 - std_t**2, 0.0))
    std = torch.full((x.shape[0],), std_t, dtype=torch.float32, device=x.device)
    return StepDistribution(mean, std, std_t)


def ode_step(sample: torch.Tensor, velocity: torch.Tensor, sigma: float,
             sigma_next: float) -> StepDistribution:
    """Deterministic Euler step of the probability-flow ODE."""
    x = sample.float()
    mean = x + velocity.float() * (sigma_next - sigma)
    return StepDistribution(mean, torch.zeros(x.shape[0], dtype=torch.float32, device=x.device),
                            0.0)


def gaussian_log_prob(value: torch.Tensor, dist: StepDistribution) -> torch.Tensor:
    """Per-sample log-density of ``value``, averaged over latent elements (as Flow-GRPO does).

    Averaging instead of summing keeps the PPO ratio on a scale independent of latent size.
    """
    std = _bview(dist.std, value).clamp_min(1e-12)
    z = (value.float().detach() - dist.mean) / std
    log_prob = -0.5 * z**2 - torch.log(std) - LOG_SQRT_2PI
    return log_prob.mean(dim=tuple(range(1, value.dim())))


def step_distribution(kind: str, sample: torch.Tensor, velocity: torch.Tensor, sigma: float,
                      sigma_next: float, noise_level: float, sigma_cap: float) -> StepDistribution:
    """Dispatch on the step kind: 'flow' (Flow-GRPO SDE), 'cps', or 'ode'."""
    if kind == "flow":
        return flow_sde_step(sample, velocity, sigma, sigma_next, noise_level, sigma_cap)
    if kind == "cps":
        return cps_step(sample, velocity, sigma, sigma_next, noise_level)
    if kind == "ode":
        return ode_step(sample, velocity, sigma, sigma_next)
    raise ValueError(f"unknown step kind {kind!r}; expected 'flow', 'cps' or 'ode'")


def kl_to_reference(dist: StepDistribution, ref_mean: torch.Tensor) -> torch.Tensor:
    """KL between two Gaussians of equal std, per sample: |mu - mu_ref|^2 / (2 std^2), averaged."""
    std = _bview(dist.std, dist.mean).clamp_min(1e-12)
    kl = (dist.mean - ref_mean.float()) ** 2 / (2 * std**2)
    return kl.mean(dim=tuple(range(1, dist.mean.dim())))
