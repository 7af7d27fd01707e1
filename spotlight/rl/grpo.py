"""GRPO's math as small pure functions: group advantages and the PPO-clipped objective."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ZERO_STD = 1e-6  # a group whose rewards spread less than this carries no learning signal


@dataclass(frozen=True)
class Advantages:
    values: np.ndarray      # (P, G), zero for dropped groups
    kept: np.ndarray        # (P,) bool: groups with reward spread
    group_std: np.ndarray   # (P,) reward std per group

    @property
    def dropped(self) -> int:
        return int((~self.kept).sum())


def group_advantages(rewards: np.ndarray, *, global_std: bool = False,
                     clip: float = 5.0) -> Advantages:
    """Per-prompt advantages (r - mean_group) / std; groups of zero spread are dropped.

    ``rewards`` is (prompts, group). With ``global_std`` the std of the whole batch normalises
    every group (Flow-GRPO's option), which keeps low-spread groups from being amplified.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (prompts, group >= 2), got shape {rewards.shape}")
    mean = rewards.mean(axis=1, keepdims=True)
    group_std = rewards.std(axis=1)
    kept = group_std > ZERO_STD
    scale = rewards.std() if global_std else group_std[:, None]
    values = (rewards - mean) / (np.maximum(scale, ZERO_STD))
    values = np.clip(values, -clip, clip) * kept[:, None]
    return Advantages(values, kept, group_std)


def learning_rate(lr: float, iteration: int, decay_iterations: int, min_fraction: float) -> float:
    """Iteration ``iteration``'s learning rate: ``lr`` decayed linearly to ``lr * min_fraction``
    over ``decay_iterations`` (0: constant), then held there."""
    if decay_iterations <= 0:
        return lr
    progress = min(iteration / decay_iterations, 1.0)
    return lr * (1.0 - (1.0 - min_fraction) * progress)


def ppo_clipped_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                     clip_range: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sample PPO-clip loss (to minimise) and diagnostics (clip fraction, approx KL)."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = {
            "clip_fraction": float(((ratio - 1).abs() > clip_range).float().mean()),
            "approx_kl": float(0.5 * ((log_prob - old_log_prob) ** 2).mean()),
        }
    return loss, stats
