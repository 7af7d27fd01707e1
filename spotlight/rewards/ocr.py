"""Flow-GRPO's OCR reward on the digits world: how close a canvas's text is to the target.

Flow-GRPO scores ``1 - min(edit distance, len(target)) / len(target)``, and a full 1 when the
target appears anywhere in the recognised text (extra glyphs around it are not punished).
"""
from __future__ import annotations

from spotlight.models.prompts import Prompt
from spotlight.rewards.base import DetectionReward
from spotlight.rewards.detect import Detection, string_of
from spotlight.rewards.registry import register_reward


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
