"""A single-process Flow-GRPO run: the reference the Dask pipeline is measured against.

Builds everything from one validated config (base model from the pretrain cache, reward by name,
prompts from the config's files), then runs iterations with periodic validation.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from spotlight.config import RunConfig
from spotlight.models.base import base_policy
from spotlight.models.prompts import world_prompts
from spotlight.rewards import build_reward, check_rewards
from spotlight.rl.objectives import build_trainer
from spotlight.rl.trainer import IterationStats, iteration_prompts, random_seeds
from spotlight.rl.validation import ValidationResult, validate


@dataclass
class RunHistory:
    """What a run measured: per-iteration stats and the validation curve (iteration, wall s, reward)."""

    iterations: list[IterationStats] = field(default_factory=list)
    val_curve: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"iterations": [asdict(s) for s in self.iterations], "val_curve": self.val_curve}


class InProcessRun:
    """Everything one process needs to post-train the digits policy."""

    def __init__(self, config: RunConfig, *, progress: bool = True) -> None:
        torch.set_num_threads(config.threads)
        self.config = config
        self.policy = base_policy(config, progress=progress)   # digits: pretrained, cached
        self.reward_fn = build_reward(config.reward)
        self.train_prompts = world_prompts(config, "train")
        self.val_prompts = world_prompts(config, "val")
        self.trainer = build_trainer(config, self.policy, self.reward_fn, check_rewards)
        self.history = RunHistory()
        self.last_validation: ValidationResult | None = None
        self._start = time.monotonic()

    def validate(self, iteration: int) -> ValidationResult:
        result = validate(self.policy, self.val_prompts, self.reward_fn, check_rewards, self.config)
        self.history.val_curve.append({"iteration": iteration, "wall_s": time.monotonic() - self._start,
                                       "val_reward": result.mean_reward})
        self.last_validation = result
        return result

    def step(self, iteration: int) -> IterationStats:
        grpo = self.config.grpo
        prompts = iteration_prompts(self.train_prompts, iteration, grpo.prompts_per_iteration,
                                    self.config.seed)
        seeds = random_seeds(self.config.seed, iteration, len(prompts), grpo.group_size)
        stats, _ = self.trainer.iteration(iteration, prompts, seeds)
        self.history.iterations.append(stats)
        return stats

    def run(self, iterations: int, *, time_budget_s: float | None = None,
            on_iteration: Callable[[IterationStats, float | None], None] | None = None) -> RunHistory:
        """Run ``iterations`` (or until the budget), validating at 0, every N, and at the end."""
        self._start = time.monotonic()
        if not self.history.val_curve:
            self.validate(0)
        done = 0
        for k in range(iterations):
            stats = self.step(k)
            done = k + 1
            val = None
            if done % self.config.validation.every == 0:
                val = self.validate(done).mean_reward
            if on_iteration is not None:
                on_iteration(stats, val)
            if time_budget_s is not None and time.monotonic() - self._start > time_budget_s:
                break
        if self.history.val_curve[-1]["iteration"] != done:
            self.validate(done)
        return self.history
