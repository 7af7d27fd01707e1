"""A trainer's update tested on its own: sample a group in this process, score it with a reward
of the test's choosing, and train on it. (A run's iterations are the iteration program's; these
tests need only the update, with rewards whose optimum they know.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spotlight.models.prompts import Prompt
from spotlight.rl.grpo import group_advantages
from spotlight.rl.nft import noised
from spotlight.rl.sampler import Trajectory, sample
from spotlight.rl.trainer import (
    FlowGRPO,
    Rollout,
    iteration_prompts,
    random_seeds,
    rollout_chunks,
    sample_keys,
)


@dataclass
class UpdateStats:
    reward_mean: float
    zero_std_groups: int
    groups: int
    loss: float
    clip_fraction: float
    approx_kl: float
    kl_to_reference: float
    learning_rate: float


def sample_group(trainer: FlowGRPO, prompts: list[Prompt], seeds: np.ndarray) -> Rollout:
    """Every (prompt, seed) SDE-sampled in the rollout's fixed-shape chunks, and scored."""
    config, policy = trainer.config, trainer.policy
    group = seeds.shape[1]
    flat = [p for p in prompts for _ in range(group)]
    policy.eval()
    trajectory = Trajectory.concat(
        [
            sample(
                policy,
                [p.text for p in prompts[c] for _ in range(group)],
                sample_keys(config.seed, prompts[c], seeds[c]),
                config.sampler,
                mode="sde",
            )
            for c in rollout_chunks(len(prompts), config.grpo.request_prompts)
        ]
    )
    images = policy.decode(trajectory.final)
    rewards = np.asarray(trainer.reward_fn(images, flat), dtype=np.float64)
    trainer.check_rewards(rewards, "rollout")
    return Rollout(
        flat,
        sample_keys(config.seed, prompts, seeds),
        trajectory,
        images,
        rewards.reshape(seeds.shape),
    )


def update(
    trainer: FlowGRPO, iteration: int, prompts: list[Prompt], seeds: np.ndarray
) -> tuple[UpdateStats, Rollout]:
    """Sample, score, and take the iteration's update on the groups that carry signal."""
    rollout = sample_group(trainer, prompts, seeds)
    grpo = trainer.config.grpo
    advantages = group_advantages(
        rollout.rewards, global_std=grpo.global_std, clip=grpo.adv_clip_max
    )
    stats = trainer.train(rollout, advantages, iteration)
    return UpdateStats(
        float(rollout.rewards.mean()), advantages.dropped, len(prompts), **stats
    ), rollout


def reward_before_and_after(
    trainer: FlowGRPO, prompts: list[Prompt], iterations: int = 8
) -> tuple[float, float, list[UpdateStats]]:
    """The mean reward of fixed probe seeds on two prompts before and after ``iterations``
    updates on two prompts a time (random seeds), with each update's statistics."""
    probe_seeds = random_seeds(99, 0, 2, 4)
    before = float(sample_group(trainer, prompts[:2], probe_seeds).rewards.mean())
    stats = [
        update(trainer, k, iteration_prompts(prompts, k, 2, 0), random_seeds(0, k, 2, 4))[0]
        for k in range(iterations)
    ]
    after = float(sample_group(trainer, prompts[:2], probe_seeds).rewards.mean())
    return before, after, stats


def assert_old_velocities_are(sampling, trainer, rollout: Rollout) -> None:
    """Every row's v_old in a forward-process trainer's last step is ``sampling``'s velocity:
    the weights the rollout was sampled with."""
    final = rollout.trajectory.final.float()
    with torch.no_grad():
        text = sampling.encode([p.text for p in rollout.prompts])
        for j, sigma in enumerate(trainer.sigmas):
            x, _ = noised(final, trainer.noise[:, j], sigma)
            expected = sampling.velocity(x, torch.tensor([sigma]), text).float()
            torch.testing.assert_close(trainer.old_velocity[:, j], expected, rtol=1e-5, atol=1e-6)
