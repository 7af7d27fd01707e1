"""The denoising loop, written out where it is used: SDE rollouts with log-probs, ODE validation.

A rollout records every step's latent, so a trajectory can be trained on, streamed to storage,
or resumed from any committed step (``start_step`` + ``start_latents``) with identical output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from spotlight.config import SamplerConfig
from spotlight.models.device import module_device, to_device
from spotlight.rl.noise import INITIAL_STEP, SampleKey, batch_noise
from spotlight.rl.sde import gaussian_log_prob, sigma_schedule, step_distribution

StepCallback = Callable[[int, torch.Tensor], None]


@dataclass
class Trajectory:
    """One batch's denoising path. ``latents[:, t]`` is the input of step t; ``latents[:, -1]``
    the output."""

    latents: torch.Tensor        # (B, T + 1, tokens, channels)
    log_probs: torch.Tensor      # (B, T); 0 for deterministic steps
    sigmas: torch.Tensor         # (T + 1,)
    trainable_steps: list[int]   # SDE steps with non-zero noise

    @property
    def final(self) -> torch.Tensor:
        return self.latents[:, -1]

    @staticmethod
    def concat(parts: list["Trajectory"]) -> "Trajectory":
        """The trajectories of consecutive chunks of one batch, as one."""
        first = parts[0]
        return Trajectory(torch.cat([p.latents for p in parts]),
                          torch.cat([p.log_probs for p in parts]), first.sigmas,
                          first.trainable_steps)


def step_kinds(config: SamplerConfig) -> list[str]:
    """Per step: the SDE kind inside the SDE window, 'ode' outside it."""
    end = config.sde_window_end
    return [config.sde_type if config.sde_window_start <= t < end else "ode"
            for t in range(config.num_steps)]


def trainable_steps(config: SamplerConfig, mode: str = "sde") -> list[int]:
    """Steps whose transition is stochastic, hence has a log-probability to train on."""
    if mode == "ode" or config.noise_level == 0:
        return []
    kinds = step_kinds(config)
    last = config.num_steps - 1
    # CPS's last step re-noises to sigma = 0, i.e. it is deterministic.
    return [t for t, k in enumerate(kinds) if k != "ode" and not (k == "cps" and t == last)]


@dataclass(frozen=True)
class StepGrid:
    """Where a denoising pass evaluates the model: ``sigmas`` (steps + 1), each step's kind and
    the steps with a log-probability."""

    sigmas: torch.Tensor
    kinds: list[str]
    trainable: list[int]


Schedule = Callable[[int], torch.Tensor]
"""num_steps -> the num_steps + 1 sigmas, from 1 down to 0, a full grid runs through."""


def schedule_of(policy, config: SamplerConfig) -> Schedule:
    """``sampler.schedule``: the policy's own sigmas ('model'), else the shifted linear grid."""
    if config.schedule == "model":
        own = getattr(policy, "sigma_schedule", None)
        if own is None:
            raise ValueError(f"sampler.schedule = 'model', but the policy "
                             f"{type(policy).__name__} has no sigma schedule of its own; use "
                             "sampler.schedule: shift")
        return own
    return lambda steps: sigma_schedule(steps, config.shift)


def step_grid(config: SamplerConfig, num_steps: int | None = None, mode: str = "sde",
              schedule: Schedule | None = None) -> StepGrid:
    """The rollout's grid, or a replay of it in ``num_steps`` model evaluations.

    A shorter replay keeps the rollout's sigmas and noise through the SDE window -- everything a
    seed decides -- and compresses only the deterministic tail after it into the remaining steps.
    On the digits world this ranks seeds like the full rollout (Kendall tau 0.79 with a 2-step
    tail, 0.89 with 3, at 60-70% of the cost), where coarsening the whole grid to half the steps
    moves the noise to other sigmas and ranks at tau 0.49. A replay too short to hold the window
    (or longer than the rollout) coarsens the whole grid.
    """
    steps = num_steps or config.num_steps
    end = config.sde_window_end
    compressed_tail = end < steps < config.num_steps
    if steps != config.num_steps and not compressed_tail:   # coarsen the whole grid
        config = SamplerConfig(**{**config.__dict__, "num_steps": steps,
                                  "sde_window_start": min(config.sde_window_start, steps - 1),
                                  "sde_window_size": min(config.sde_window_size, steps)})
    sigmas = (schedule or schedule_of(None, config))(config.num_steps)
    kinds = step_kinds(config) if mode == "sde" else ["ode"] * config.num_steps
    trainable = trainable_steps(config, mode)
    if compressed_tail:   # the rollout's grid through the window, fewer ODE steps after it
        tail = torch.linspace(float(sigmas[end]), 0.0, steps - end + 1)[1:]
        sigmas = torch.cat([sigmas[:end + 1], tail.to(sigmas.dtype)])
        kinds = kinds[:end] + ["ode"] * (steps - end)
        trainable = [t for t in trainable if t < end]
    return StepGrid(sigmas, kinds, trainable)


def initial_latents(keys: list[SampleKey], tokens_shape: tuple[int, int]) -> torch.Tensor:
    return batch_noise(keys, INITIAL_STEP, tokens_shape)


@torch.no_grad()
def sample(policy, prompts: list[str], keys: list[SampleKey], config: SamplerConfig, *,
           mode: str = "sde", start_step: int = 0, start_latents: torch.Tensor | None = None,
           on_step: StepCallback | None = None, num_steps: int | None = None) -> Trajectory:
    """Denoise a batch. ``mode='sde'`` follows the configured SDE window, ``'ode'`` is
    deterministic.

    ``num_steps`` overrides the number of model evaluations (an exploration replay, see
    :func:`step_grid`). ``on_step(t, x)`` is called with the latent after each step t, so callers
    can stream it to storage.

    Every tensor of the loop lives on the policy's device; the noise, drawn on the host from
    each sample's own generator (the same numbers on any device), goes there without waiting,
    and nothing in the loop reads the device back: the trajectory stays there.
    """
    if len(prompts) != len(keys):
        raise ValueError(f"sample: {len(prompts)} prompts but {len(keys)} sample keys")
    grid = step_grid(config, num_steps, mode, schedule_of(policy, config))
    sigmas, kinds = grid.sigmas, grid.kinds
    steps, device = len(kinds), module_device(policy)
    x = (initial_latents(keys, policy.tokens_shape) if start_latents is None
         else start_latents.float())
    x = to_device(x, device)
    latents = torch.zeros(len(keys), steps + 1, *policy.tokens_shape, device=device)
    latents[:, start_step] = x
    log_probs = torch.zeros(len(keys), steps, device=device)
    text = policy.encode(prompts)
    sigma_cap, sigmas_there = float(sigmas[1]), to_device(sigmas, device)
    for t in range(start_step, steps):
        sigma, sigma_next = float(sigmas[t]), float(sigmas[t + 1])
        v = policy.velocity(x, sigmas_there[t:t + 1], text)
        dist = step_distribution(kinds[t], x, v, sigma, sigma_next, config.noise_level, sigma_cap)
        if kinds[t] == "ode" or dist.deterministic:
            x = dist.mean
        else:
            noise = to_device(batch_noise(keys, t, policy.tokens_shape), device)
            x = dist.mean + dist.std.view(-1, 1, 1) * noise
            log_probs[:, t] = gaussian_log_prob(x, dist)
        latents[:, t + 1] = x
        if on_step is not None:
            on_step(t, x)
    return Trajectory(latents, log_probs, sigmas, grid.trainable)


def transition_distribution(policy, traj_latents: torch.Tensor, t: int, sigmas: torch.Tensor,
                            text, config: SamplerConfig):
    """Recompute step t's distribution for latents ``traj_latents[:, t]`` under ``policy`` (with
    grad), on the device the latents are on."""
    x = traj_latents[:, t]
    v = policy.velocity(x, to_device(sigmas[t:t + 1], x.device), text)
    return step_distribution(step_kinds(config)[t], x, v, float(sigmas[t]), float(sigmas[t + 1]),
                             config.noise_level, float(sigmas[1]))
