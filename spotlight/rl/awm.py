"""Advantage Weighted Matching (AWM, arXiv 2509.25050) as small pure functions.

AWM trains with the pretraining loss itself. A clean sample x0 is re-noised at a noise level s
drawn as pretraining draws its timesteps, x_s = (1 - s) x0 + s e, and the velocity v the model
predicts there is scored by the flow-matching log-likelihood

    l(v) = -mean |v - (e - x0)|^2

(the Gaussian log-likelihood of the denoised sample, up to constants and the time weighting,
which is uniform here). The loss is Flow-GRPO's PPO-clipped surrogate on that likelihood
instead of the SDE steps' (:func:`spotlight.rl.grpo.ppo_clipped_loss`): at the sampling policy
the ratio exp(l - l_old) is 1 and the gradient is the advantage times the flow-matching
gradient -- a well-rewarded sample is fitted more, a badly rewarded one less, and no
log-probability of the sampler's steps is needed, so any sampler may produce the samples.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch

from spotlight.rl.noise import derive_seed

LOWEST_SIGMA = 0.01   # AWM's floor on the drawn noise level: near 0 the loss sees pixels only


def awm_sigmas(run_seed: int, iteration: int, count: int, shift: float) -> list[float]:
    """``count`` noise levels for one iteration, stratified over the law pretraining draws
    its timesteps from: logit-normal (the sigmoid of a standard normal, as SD3 and Qwen-Image
    train), shifted toward noise by ``shift`` (s -> shift s / (1 + (shift - 1) s); 1: none).
    One level from each equal slice of the normal's quantiles, so an iteration trains high and
    low noise alike; ascending, the same for the same (seed, iteration)."""
    rng = np.random.default_rng(derive_seed(run_seed, iteration, 59))
    normal = NormalDist()
    out = []
    for j in range(count):
        u = min(max((j + rng.uniform()) / count, 1e-7), 1 - 1e-7)
        s = 1.0 / (1.0 + math.exp(-normal.inv_cdf(u)))
        out.append(max(LOWEST_SIGMA, shift * s / (1.0 + (shift - 1.0) * s)))
    return out


def matching_log_likelihood(velocity: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per sample: minus the flow-matching loss, its squared error averaged over the latent's
    elements."""
    return -((velocity - target) ** 2).mean(dim=tuple(range(1, velocity.dim())))
