"""Rewards, registered by name.

``build_reward(config.reward)`` returns a ``RewardFn``: ``(images, prompts) -> (B,) float64 in
[0, 1]`` with a ``recognizer_accuracy`` property. On the digits world, ``ocr`` is Flow-GRPO's
OCR score of the string read off a canvas (``ocr-dense`` adds the recogniser's belief in each
target glyph, a reward that ranks canvases no one can read yet) and ``geneval`` GenEval's
count/colour/position checks as partial credit, both read with a classical detector
(``detect``) and a small CNN (``recognizer``). On real images, ``ocr-text`` reads with an OCR
engine (PP-OCR, or a vision-language model) and ``geneval-image`` scores GenEval's clauses on a
transformers detector's boxes.
"""
from __future__ import annotations

from spotlight.rewards.registry import (
    REWARDS,
    RewardFn,
    build_reward,
    check_rewards,
    register_reward,
)

# Importing the reward modules registers them; the order fixes the order REWARDS lists them in.
# isort: off
from spotlight.rewards.ocr import OcrDenseReward, OcrReward, levenshtein, ocr_score
from spotlight.rewards.geneval import GenevalReward, geneval_score
from spotlight.rewards.text_ocr import OcrEngine, TextOcrReward
from spotlight.rewards.vision import GenevalImageReward
# isort: on
from spotlight.rewards.detect import Detection, DetectorSettings, detect, detect_batch, read_string
from spotlight.rewards.recognizer import Recognizer, load_or_train_recognizer

__all__ = [
    "REWARDS", "RewardFn", "build_reward", "check_rewards", "register_reward",
    "Detection", "DetectorSettings", "detect", "detect_batch", "read_string",
    "GenevalReward", "geneval_score", "OcrReward", "OcrDenseReward", "levenshtein", "ocr_score",
    "OcrEngine", "TextOcrReward", "GenevalImageReward",
    "Recognizer", "load_or_train_recognizer",
]
