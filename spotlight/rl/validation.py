"""Validation: held-out prompts x fixed seeds, deterministic ODE sampling, mean reward.

The seeds do not depend on the run seed, so validation scores of different runs and modes
compare the same noises.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spotlight.config import RunConfig
from spotlight.models.prompts import Prompt
from spotlight.rl.noise import SampleKey, prompt_id
from spotlight.rl.sampler import sample

VALIDATION_RUN_SEED = 0x5EED


@dataclass
class ValidationResult:
    mean_reward: float
    rewards: np.ndarray     # (prompts, seeds)
    images: np.ndarray      # (prompts * seeds, 3, H, W)
    prompts: list[Prompt]


@torch.no_grad()
def validate(policy, prompts: list[Prompt], reward_fn, check_rewards, config: RunConfig,
             batch_size: int = 64) -> ValidationResult:
    cfg = config.validation
    prompts = prompts[: cfg.max_prompts]
    flat = [p for p in prompts for _ in range(cfg.seeds_per_prompt)]
    keys = [SampleKey(VALIDATION_RUN_SEED, prompt_id(p.text), s)
            for p in prompts for s in range(cfg.seeds_per_prompt)]
    policy.eval()
    images = []
    for start in range(0, len(flat), batch_size):
        chunk = slice(start, start + batch_size)
        traj = sample(policy, [p.text for p in flat[chunk]], keys[chunk], config.sampler,
                      mode="ode")
        images.append(policy.decode(traj.final))
    images = np.concatenate(images)
    rewards = np.asarray(reward_fn(images, flat), dtype=np.float64)
    check_rewards(rewards, "validation")
    rewards = rewards.reshape(len(prompts), cfg.seeds_per_prompt)
    return ValidationResult(float(rewards.mean()), rewards, images, prompts)


def standard_error(rewards: np.ndarray) -> float:
    """The standard error of a validation's mean reward, prompts as the unit (a prompt's seeds
    share its difficulty, so they are not independent draws): the standard deviation of the
    prompt means over the square root of the prompt count. ``rewards``: (prompts, seeds)."""
    means = np.asarray(rewards, dtype=np.float64).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(len(means))) if len(means) > 1 else float("nan")
