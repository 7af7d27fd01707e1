"""Rewards of the digits world, registered by name.

``build_reward(config.reward)`` returns a ``RewardFn``: ``(images, prompts) -> (B,) float64 in
[0, 1]`` with a ``recognizer_accuracy`` property. ``ocr`` is Flow-GRPO's OCR score of the string
read off a canvas; ``geneval`` is GenEval's count/colour/position checks as partial credit. Both
read canvases with a classical detector (``detect``) and a small CNN (``recognizer``).
"""
from __future__ import annotations

from spotlight.rewards.registry import (REWARDS, RewardFn, build_reward, check_rewards,
                                        register_reward)

# Importing the reward modules registers them; the order fixes the order REWARDS lists them in.
from spotlight.rewards.ocr import OcrReward, levenshtein, ocr_score  # noqa: E402  isort: skip
from spotlight.rewards.geneval import GenevalReward, geneval_score  # noqa: E402  isort: skip
from spotlight.rewards.text_ocr import OcrEngine, TextOcrReward  # noqa: E402  isort: skip
from spotlight.rewards.detect import (Detection, DetectorSettings, detect,  # noqa: E402
                                      detect_batch, read_string)
from spotlight.rewards.recognizer import Recognizer, load_or_train_recognizer  # noqa: E402

__all__ = [
    "REWARDS", "RewardFn", "build_reward", "check_rewards", "register_reward",
    "Detection", "DetectorSettings", "detect", "detect_batch", "read_string",
    "GenevalReward", "geneval_score", "OcrReward", "levenshtein", "ocr_score",
    "OcrEngine", "TextOcrReward",
    "Recognizer", "load_or_train_recognizer",
]
