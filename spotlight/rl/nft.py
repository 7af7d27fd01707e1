"""The forward-process objective (DiffusionNFT's) as small pure functions.

A clean sample x0 with reward r is re-noised at noise level s, x_s = (1 - s) x0 + s e, whose
flow-matching target is the velocity v* = e - x0 (the sampler's convention: v = noise - data).
Two implicit policies mix the trained velocity v with the sampling policy's v_old:

    v+ = (1 - b) v_old + b v        (moved toward v)
    v- = (1 + b) v_old - b v        (moved away from v)

and the loss r |v+ - v*|^2 + (1 - r) |v- - v*|^2 pulls v+ onto the data the reward likes and
v- onto the data it does not: a well-rewarded sample moves v toward its target, a badly
rewarded one away from it, and r = 1/2 only keeps v near v_old. No log-probability appears,
so the samples may come from any sampler -- ODE, SDE, a few-step solver, older weights.
"""
from __future__ import annotations

import numpy as np
import torch

from spotlight.rl.noise import derive_seed


def optimality(advantages: np.ndarray, clip: float) -> np.ndarray:
    """Each sample's optimality probability r in [0, 1] from its group advantage: 1/2 at the
    group mean, 0 and 1 at -clip and +clip (the advantages' own clip)."""
    return 0.5 + 0.5 * np.clip(np.asarray(advantages, dtype=np.float64) / clip, -1.0, 1.0)


def training_sigmas(run_seed: int, iteration: int, count: int, low: float) -> list[float]:
    """``count`` noise levels for one iteration, one drawn uniformly in each equal slice of
    [low, 1): stratified, so every iteration trains high and low noise alike."""
    rng = np.random.default_rng(derive_seed(run_seed, iteration, 43))
    width = (1.0 - low) / count
    return [float(low + width * (j + rng.uniform())) for j in range(count)]


def training_noise(run_seed: int, iteration: int, rows: int, count: int,
                   shape: tuple[int, ...]) -> torch.Tensor:
    """The forward-process noise e, (rows, count, *shape), of an iteration's rows (the
    rollout's samples, prompt-major): each row's from its own generator, so a data-parallel
    share draws what the whole batch would."""
    out = torch.empty(rows, count, *shape)
    for row in range(rows):
        gen = torch.Generator().manual_seed(derive_seed(run_seed, iteration, 47, row))
        out[row] = torch.randn(count, *shape, generator=gen)
    return out


def noised(x0: torch.Tensor, noise: torch.Tensor,
           sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_s, its flow-matching target velocity) at noise level ``sigma``."""
    return (1.0 - sigma) * x0 + sigma * noise, noise - x0


def nft_loss(velocity: torch.Tensor, old_velocity: torch.Tensor, target: torch.Tensor,
             optimal: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-sample loss (to minimise), each squared error averaged over the latent's elements."""
    positive = (1.0 - beta) * old_velocity + beta * velocity
    negative = (1.0 + beta) * old_velocity - beta * velocity
    dims = tuple(range(1, velocity.dim()))
    pos_err = ((positive - target) ** 2).mean(dim=dims)
    neg_err = ((negative - target) ** 2).mean(dim=dims)
    return optimal * pos_err + (1.0 - optimal) * neg_err


def sampling_decay(decay: float, ramp: int, iteration: int) -> float:
    """The soft update's decay e after ``iteration``'s step: ``decay``, reached linearly over the
    first ``ramp`` iterations (so the first updates stay close to on-policy)."""
    if ramp <= 0:
        return decay
    return decay * min(1.0, (iteration + 1) / ramp)


def soft_update_(sampling: list[torch.Tensor], trained: list[torch.Tensor],
                 decay: float) -> None:
    """phi <- e phi + (1 - e) theta, in place on ``sampling``: the sampling policy follows the
    trained weights as a moving average (e = 0: it is the trained weights)."""
    with torch.no_grad():
        for phi, theta in zip(sampling, trained):
            phi.lerp_(theta.to(phi.dtype), 1.0 - decay)
