"""GenEval on real images: GenEval's clauses scored on what a detector finds.

A prompt is GenEval metadata (``tag``, ``include``, ``exclude``, ``prompt``; see
:mod:`spotlight.models.prompts`). As GenEval's evaluator does, detections below a confidence of
0.3 are dropped and each class's detections are taken by decreasing confidence; then

- an ``include`` clause holds when at least ``count`` objects of its class are found, the first
  ``count`` of them have its ``color`` (when named; a colour classifier names each one), and
  every one of them stands in its ``position`` relation (when given, ``[relation, j]``) to every
  object matched by clause ``j``, a clause that must itself have held;
- an ``exclude`` clause holds when fewer than ``count`` objects of its class are found (GenEval's
  counting prompts exclude ``count + 1``, so a count must be exact).

GenEval passes an image when every clause holds (``strict``); the RL reward gives partial credit,
one equal share per clause (``score``), so an image with the right objects in the wrong place
still ranks above an empty one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from spotlight.models.prompts import GENEVAL_COLORS  # noqa: F401  (the classifier's choices)

CONFIDENCE = 0.3
"""GenEval's detection threshold."""
POSITION_THRESHOLD = 0.1
"""GenEval's position margin: centres must differ by this fraction of the boxes' mean size."""


@dataclass(frozen=True)
class Box:
    """One detected object: class name, confidence, pixel box (x0, y0, x1, y1)."""

    label: str
    score: float
    xyxy: tuple[float, float, float, float]

    @property
    def centre(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.xyxy
        return (x0 + x1) / 2, (y0 + y1) / 2

    @property
    def size(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.xyxy
        return x1 - x0, y1 - y0


class Detector(Protocol):
    """Finds objects: images (B, 3, H, W) float32 in [0, 1] -> per image its boxes."""

    def detect(self, images: np.ndarray) -> list[list[Box]]: ...


class ColorClassifier(Protocol):
    """Names the colour (one of :data:`GENEVAL_COLORS`) of each boxed object of ``cls``."""

    def classify(self, image: np.ndarray, boxes: Sequence[Box], cls: str) -> list[str]: ...


ColorsOf = Callable[[Sequence[Box], str], list[str]]


def relations(subject: Box, other: Box, threshold: float = POSITION_THRESHOLD) -> set[str]:
    """Every relation (left of, right of, above, below) ``subject`` stands in to ``other``: the
    centres differ along that axis by more than ``threshold`` x the boxes' mean extent."""
    (sx, sy), (ox, oy) = subject.centre, other.centre
    width = (subject.size[0] + other.size[0]) / 2
    height = (subject.size[1] + other.size[1]) / 2
    found = set()
    if sx < ox - threshold * width:
        found.add("left of")
    if sx > ox + threshold * width:
        found.add("right of")
    if sy < oy - threshold * height:
        found.add("above")
    if sy > oy + threshold * height:
        found.add("below")
    return found


def by_class(boxes: Sequence[Box], confidence: float = CONFIDENCE) -> dict[str, list[Box]]:
    """Confident detections per class, most confident first."""
    found: dict[str, list[Box]] = {}
    for box in sorted(boxes, key=lambda b: -b.score):
        if box.score >= confidence:
            found.setdefault(box.label, []).append(box)
    return found


def clause_results(record: dict, boxes: Sequence[Box], colors_of: ColorsOf,
                   confidence: float = CONFIDENCE) -> list[bool]:
    """Whether each clause of GenEval metadata ``record`` holds: include clauses in order, then
    exclude clauses."""
    found = by_class(boxes, confidence)
    results: list[bool] = []
    matched: list[list[Box] | None] = []
    for clause in record.get("include", []):
        count = int(clause.get("count", 1))
        objects = found.get(clause["class"], [])[:count]
        holds = len(objects) >= count
        if holds and clause.get("color"):
            holds = colors_of(objects, clause["class"]).count(clause["color"]) >= count
        if holds and clause.get("position"):
            relation, j = clause["position"]
            targets = matched[j] if j < len(matched) else None
            holds = targets is not None and all(relation in relations(o, t)
                                                for o in objects for t in targets)
        matched.append(objects if holds else None)
        results.append(holds)
    for clause in record.get("exclude", []):
        results.append(len(found.get(clause["class"], [])) < int(clause["count"]))
    if not results:
        raise ValueError(f"GenEval prompt {record.get('prompt')!r} has no clauses to check")
    return results


def geneval_image_score(record: dict, boxes: Sequence[Box], colors_of: ColorsOf) -> float:
    """Partial credit: the share of the record's clauses that hold."""
    results = clause_results(record, boxes, colors_of)
    return sum(results) / len(results)
