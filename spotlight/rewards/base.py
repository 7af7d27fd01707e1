"""The shared shape of the digit-world rewards: detect on every canvas, score for its prompt."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.rewards.detect import Detection, DetectorSettings, detect_batch
from spotlight.rewards.recognizer import Recognizer, load_or_train_recognizer
from spotlight.rewards.registry import check_batch, check_rewards


class DetectionReward:
    """A ``RewardFn`` that scores detections; subclasses set ``name``, ``task`` and ``score``."""

    name = "<abstract>"
    task = "<abstract>"

    def __init__(self, config: RewardConfig, *, recognizer: Recognizer | None = None,
                 settings: DetectorSettings = DetectorSettings()) -> None:
        self.config = config
        self.recognizer = recognizer or load_or_train_recognizer(config.recognizer_epochs,
                                                                 config.recognizer_seed)
        self.settings = settings

    @property
    def recognizer_accuracy(self) -> float:
        """Held-out accuracy of the recogniser this reward reads with."""
        return self.recognizer.accuracy

    def score(self, detections: list[Detection], prompt: Prompt) -> float:
        """Reward in [0, 1] of one canvas's detections for its prompt."""
        raise NotImplementedError

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        check_batch(images, prompts, self.task, self.name)
        found = detect_batch(images, self.recognizer, self.settings)
        values = np.asarray([self.score(d, p) for d, p in zip(found, prompts)], np.float64)
        return check_rewards(values, where=f"reward '{self.name}'")
