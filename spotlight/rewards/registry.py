"""Rewards by name: ``@register_reward("ocr")`` adds a builder, ``build_reward`` picks by config.

A reward is a ``RewardFn``: ``(images (B, 3, H, W) float32 in [0, 1], prompts) -> (B,) float64
in [0, 1]``, also telling the held-out accuracy of the recogniser it reads with, which the
benchmark reports next to every reward curve. With ``reward.service.url`` set, the reward is
computed by a reward service over HTTP (``spotlight serve-reward``; docs/reward-service.md) and
``build_reward`` returns its client, :class:`~spotlight.rewards.service.ServiceReward`.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.rewards.batch import check_canvases
from spotlight.rewards.service import ServiceReward


class RewardFn(Protocol):
    """A batched reward function of canvases and their prompts."""

    name: str

    @property
    def recognizer_accuracy(self) -> float:
        """Held-out accuracy of the digit recogniser behind the reward."""
        ...

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray: ...


RewardBuilder = Callable[[RewardConfig], RewardFn]
REWARDS: dict[str, RewardBuilder] = {}
"""Registered reward builders by name."""


def register_reward(name: str) -> Callable[[RewardBuilder], RewardBuilder]:
    """Class or function decorator: ``build_reward`` will call it with the ``RewardConfig``."""

    def add(builder: RewardBuilder) -> RewardBuilder:
        if name in REWARDS:
            raise ValueError(f"reward '{name}' is registered twice ({REWARDS[name]!r} and "
                             f"{builder!r}); pick another name")
        REWARDS[name] = builder
        return builder

    return add


def build_reward(config: RewardConfig) -> RewardFn:
    """The reward named by ``config.name``, built with the config's recogniser settings; with
    ``config.service.url`` set, a client of the reward service there, which must serve that
    reward (the name need not be registered here: a server may register its own)."""
    if config.service.url:
        return ServiceReward(config)
    if config.name not in REWARDS:
        raise ValueError(f"RewardConfig.name = {config.name!r} is not a registered reward; "
                         f"choose one of {sorted(REWARDS)}")
    return REWARDS[config.name](config)


def check_rewards(values: np.ndarray, where: str) -> np.ndarray:
    """``values`` as float64, or a ValueError naming ``where`` and the non-finite sample indices.

    A NaN reward poisons every advantage of its group, so it is refused where it is produced.
    """
    values = np.asarray(values, np.float64)
    bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
    if len(bad):
        shown = ", ".join(f"{i}: {values.reshape(-1)[i]}" for i in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise ValueError(f"{where}: rewards of samples [{shown}]{more} are not finite; "
                         "check the reward function and the canvases it was given")
    return values


def check_batch(images: np.ndarray, prompts: Sequence[Prompt], task: str, reward: str) -> None:
    """Refuse a batch whose shape, length or prompt family does not fit reward ``reward``."""
    check_canvases(images, prompts, reward)
    wrong = [i for i, p in enumerate(prompts) if p.task != task]
    if wrong:
        raise ValueError(f"reward '{reward}' scores '{task}' prompts, but prompts {wrong[:10]} are "
                         f"'{prompts[wrong[0]].task}'; set reward.name to match world.task")
