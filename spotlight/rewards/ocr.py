"""Flow-GRPO's OCR reward on the digits world: how close a canvas's text is to the target.

Flow-GRPO scores ``1 - min(edit distance, len(target)) / len(target)``, and a full 1 when the
target appears anywhere in the recognised text (extra glyphs around it are not punished).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spotlight.models.prompts import Prompt
from spotlight.models.world import DIGIT
from spotlight.rewards.base import DetectionReward
from spotlight.rewards.detect import Detection, string_of
from spotlight.rewards.recognizer import PATCH, Recognizer
from spotlight.rewards.registry import check_rewards, register_reward


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertion, deletion, substitution each cost 1) by a two-row programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1,                  # delete ca
                               current[j - 1] + 1,               # insert cb
                               previous[j - 1] + (ca != cb)))    # substitute
        previous = current
    return previous[-1]


def ocr_score(recognized: str, target: str) -> float:
    """Flow-GRPO's OCR score in [0, 1] of ``recognized`` text for ``target``.

    Spaces are ignored and case is folded, as in Flow-GRPO; an empty target scores 1 only when
    nothing was read (there is nothing to misspell), else 0.
    """
    recognized = recognized.replace(" ", "").lower()
    target = target.replace(" ", "").lower()
    if not target:
        return 1.0 if not recognized else 0.0
    if target in recognized:
        return 1.0
    return 1.0 - min(levenshtein(recognized, target), len(target)) / len(target)


@register_reward("ocr")
class OcrReward(DetectionReward):
    """Reads each canvas left to right and scores it with ``ocr_score`` for the prompt's target."""

    name = "ocr"
    task = "ocr"

    def score(self, detections: list[Detection], prompt: Prompt) -> float:
        return ocr_score(string_of(detections), prompt.target or "")


DENSE_WEIGHT = 0.25
"""Share of ``ocr-dense``'s reward that is the recogniser's belief in the target's glyphs."""


def glyph_slots(target: str, height: int, width: int) -> list[tuple[int, int]]:
    """Top-left corners of the recogniser patches over the target's glyphs where the digits
    world writes them (:func:`spotlight.models.world.render_ocr`, before its jitter): the
    glyph centred in each patch."""
    y = (height - DIGIT) // 2 - (PATCH - DIGIT) // 2
    return [(y, 2 + i * (DIGIT + 1) - (PATCH - DIGIT) // 2) for i in range(len(target))]


def crop(canvas: np.ndarray, y: int, x: int) -> np.ndarray:
    """The ``PATCH`` square of ``canvas`` (3, H, W) at (y, x); outside the canvas is black."""
    patch = np.zeros((3, PATCH, PATCH), np.float32)
    y0, x0 = max(y, 0), max(x, 0)
    y1, x1 = min(y + PATCH, canvas.shape[1]), min(x + PATCH, canvas.shape[2])
    if y0 < y1 and x0 < x1:
        patch[:, y0 - y:y1 - y, x0 - x:x1 - x] = canvas[:, y0:y1, x0:x1]
    return patch


def target_likelihood(images: np.ndarray, prompts: Sequence[Prompt],
                      recognizer: Recognizer) -> np.ndarray:
    """Per canvas, the recogniser's mean probability of each target digit in its slot: a
    score in [0, 1] that moves with every pixel, where reading the string is all or nothing."""
    patches, owners, digits = [], [], []
    for i, (canvas, prompt) in enumerate(zip(images, prompts)):
        target = (prompt.target or "").replace(" ", "")
        for (y, x), ch in zip(glyph_slots(target, canvas.shape[1], canvas.shape[2]), target):
            patches.append(crop(canvas, y, x))
            owners.append(i)
            digits.append(int(ch))
    out = np.zeros(len(images), np.float64)
    if not patches:
        return out
    probs = recognizer.probabilities(np.stack(patches))[np.arange(len(digits)), digits]
    counts = np.bincount(owners, minlength=len(images))
    np.add.at(out, owners, probs)
    return np.divide(out, counts, out=np.zeros_like(out), where=counts > 0)


@register_reward("ocr-dense")
class OcrDenseReward(OcrReward):
    """Flow-GRPO's OCR score plus a dense part, the recogniser's belief in each target glyph
    where the world writes it (weight :data:`DENSE_WEIGHT`). On a model that writes no
    legible string yet -- a few pretraining steps, a few denoising steps -- the OCR score is 0
    for every seed and GRPO has nothing to learn from; the dense part still ranks the seeds.
    The tiny pipeline tests use it so that their runs have reward spread and moving weights."""

    name = "ocr-dense"

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        ocr = super().__call__(images, prompts)
        dense = target_likelihood(np.asarray(images, np.float32), prompts, self.recognizer)
        return check_rewards((1 - DENSE_WEIGHT) * ocr + DENSE_WEIGHT * dense,
                             where=f"reward '{self.name}'")
