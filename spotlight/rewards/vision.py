"""Vision models behind the real-image rewards, through transformers, from a folder the user
stages (a local path or an object-storage URL, copied once and checked; no registry package
ships detector weights, and nothing is downloaded):

- :class:`TransformersDetector`: any ``AutoModelForObjectDetection`` with its image processor
  (DETR, Conditional/Deformable DETR, YOLOS, ...), class names from the model's ``id2label``;
- :class:`ClipColorClassifier`: a CLIP-style model and processor naming an object's colour by
  zero-shot scores of "a photo of a {colour} {class}", on the object's crop, as GenEval does;

and the ``geneval-image`` reward that scores GenEval clauses on their output.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt, geneval_record
from spotlight.rewards.geneval_image import (
    CONFIDENCE,
    GENEVAL_COLORS,
    Box,
    ColorClassifier,
    Detector,
    geneval_image_score,
)
from spotlight.rewards.registry import check_batch, check_rewards, register_reward
from spotlight.staging import StagingError, staged_folder

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def needs(*files: str | tuple[str, ...]):
    """A folder check: each entry is a file, or a tuple of files one of which must be there."""
    def check(folder: Path, named: str) -> None:
        missing = [f if isinstance(f, str) else " or ".join(f) for f in files
                   if not any((folder / name).is_file()
                              for name in ((f,) if isinstance(f, str) else f))]
        if missing:
            raise StagingError(f"{named!r} lacks {missing}; stage the folder save_pretrained "
                               "wrote for the model and its processor")
    return check


def to_uint8(images: np.ndarray) -> list[np.ndarray]:
    """(B, 3, H, W) float in [0, 1] -> B arrays (H, W, 3) uint8, what image processors take."""
    pixels = (np.clip(np.asarray(images), 0.0, 1.0) * 255).round().astype(np.uint8)
    return [np.ascontiguousarray(p.transpose(1, 2, 0)) for p in pixels]


def quiet_transformers() -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


class TransformersDetector:
    """Object detection with a transformers model from ``source``, batched."""

    def __init__(self, source: str, threshold: float = CONFIDENCE, batch_size: int = 8) -> None:
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        quiet_transformers()
        folder = staged_folder(source, "reward.detector",
                               needs("config.json", PROCESSOR_FILES))
        self.processor = AutoImageProcessor.from_pretrained(folder)
        self.model = AutoModelForObjectDetection.from_pretrained(folder).eval()
        self.labels = self.model.config.id2label
        self.threshold, self.batch_size = threshold, batch_size

    @torch.no_grad()
    def detect(self, images: np.ndarray) -> list[list[Box]]:
        pixels = to_uint8(images)
        out: list[list[Box]] = []
        for start in range(0, len(pixels), self.batch_size):
            batch = pixels[start:start + self.batch_size]
            inputs = self.processor(images=batch, return_tensors="pt")
            raw = self.model(**inputs)
            results = self.processor.post_process_object_detection(
                raw, threshold=self.threshold, target_sizes=[p.shape[:2] for p in batch])
            out += [[Box(self.labels[int(label)], float(score), tuple(float(v) for v in box))
                     for score, label, box in zip(r["scores"], r["labels"], r["boxes"])]
                    for r in results]
        return out


class ClipColorClassifier:
    """Zero-shot colour of each boxed object with a CLIP-style model from ``source``."""

    def __init__(self, source: str, colors: Sequence[str] = GENEVAL_COLORS) -> None:
        from transformers import AutoModel, AutoProcessor

        quiet_transformers()
        folder = staged_folder(source, "reward.color_classifier",
                               needs("config.json", PROCESSOR_FILES))
        self.processor = AutoProcessor.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).eval()
        self.colors = tuple(colors)

    @torch.no_grad()
    def classify(self, image: np.ndarray, boxes: Sequence[Box], cls: str) -> list[str]:
        if not boxes:
            return []
        pixels = to_uint8(image[None])[0]
        crops = [_crop(pixels, box) for box in boxes]
        texts = [f"a photo of a {color} {cls}" for color in self.colors]
        inputs = self.processor(text=texts, images=crops, return_tensors="pt", padding=True)
        logits = self.model(**inputs).logits_per_image   # (crops, colours)
        return [self.colors[int(i)] for i in logits.argmax(dim=1)]


def _crop(pixels: np.ndarray, box: Box) -> np.ndarray:
    """The box's pixels (at least one pixel, inside the image)."""
    h, w = pixels.shape[:2]
    x0, y0, x1, y1 = box.xyxy
    x0, y0 = min(max(int(x0), 0), w - 1), min(max(int(y0), 0), h - 1)
    x1, y1 = max(min(int(np.ceil(x1)), w), x0 + 1), max(min(int(np.ceil(y1)), h), y0 + 1)
    return np.ascontiguousarray(pixels[y0:y1, x0:x1])


@register_reward("geneval-image")
class GenevalImageReward:
    """GenEval's clauses with partial credit on real images (``reward.detector`` and, for colour
    clauses, ``reward.color_classifier``)."""

    name = "geneval-image"

    def __init__(self, config: RewardConfig, detector: Detector | None = None,
                 colors: ColorClassifier | None = None) -> None:
        if detector is None and not config.detector:
            raise ValueError("reward 'geneval-image' needs reward.detector: a folder or "
                             "object-storage URL of a transformers object-detection model and "
                             "its image processor")
        self.detector = detector or TransformersDetector(config.detector)
        self._colors = colors
        self._colors_source = config.color_classifier

    @property
    def recognizer_accuracy(self) -> float:
        return float("nan")   # a pretrained detector: no held-out split of ours to report

    def colors(self) -> ColorClassifier:
        if self._colors is None:
            if not self._colors_source:
                raise ValueError("a GenEval prompt names a colour, but reward.color_classifier "
                                 "is empty; stage a CLIP-style model and set it")
            self._colors = ClipColorClassifier(self._colors_source)
        return self._colors

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        check_batch(images, prompts, "geneval", self.name)
        found = self.detector.detect(images)
        values = []
        for image, boxes, prompt in zip(images, found, prompts):
            def colors_of(objects, cls, image=image):
                return self.colors().classify(image, objects, cls)

            values.append(geneval_image_score(geneval_record(prompt), boxes, colors_of))
        return check_rewards(np.asarray(values, np.float64), where=f"reward '{self.name}'")
