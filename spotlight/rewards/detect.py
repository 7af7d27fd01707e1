"""A classical object detector for digit canvases: threshold, connected components, recognise.

The rewards score generated canvases, which are noisy and blurry, so the detector is defensive:
specks are dropped, fragments of one glyph are merged back, components too long for one digit
(glyphs that touch) are split where the pieces read best and the ink is thin, ink of
neighbouring objects is masked out of each crop, and objects the recogniser is unsure of are
skipped. Pure noise must stay cheap too (an untrained policy draws it), so the costly
recognition-driven split is reserved for what looks like a row of touching glyphs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import ndimage

from spotlight.models.prompts import PALETTE
from spotlight.models.world import DIGIT
from spotlight.rewards.recognizer import PATCH, Recognizer, load_or_train_recognizer

_EIGHT_CONNECTED = np.ones((3, 3), bool)
_COLOR_NAMES = (*PALETTE, "white")
_COLOR_RGB = np.asarray([*PALETTE.values(), (1.0, 1.0, 1.0)], np.float64)
_MAX_CUTS = 25
"""Most candidate splits of one component kept (5 per cut: all of them for 3 glyphs in a row)."""
_MAX_JUDGED_PIECES = 3
"""Longer rows (noise blobs, mostly; an OCR target has at most 3 digits) are cut by profile."""
_PROFILE_WEIGHT = 0.5
"""Log-confidence traded per typical line of ink at a cut, when judging splits."""
BBox = tuple[int, int, int, int]
"""(y0, x0, y1, x1), end-exclusive."""


@dataclass(frozen=True)
class DetectorSettings:
    """Thresholds of the detector; the defaults suit 8x8 digits on canvases of 12-64 pixels."""

    ink_threshold: float = 0.3
    """A pixel is ink when its brightest channel exceeds this (faint digit edges are ~0.1-0.25)."""
    min_speck: int = 2
    """Components smaller than this are noise, dropped before merging so they cannot chain up."""
    min_area: int = 6
    """Objects smaller than this after merging are dropped; the smallest real digit has 16."""
    max_side: int = 11
    """A component longer than this along an axis holds several touching glyphs and is split."""
    merge_side: int = DIGIT + 1
    """Fragments whose joint bounding box fits this square are one glyph (two glyphs never fit)."""
    min_confidence: float = 0.3
    """Objects the recogniser is less sure of are skipped (GenEval uses the same 0.3 cut)."""
    color_tolerance: float = 0.45
    """Largest RGB distance to the nearest named colour; farther means colour ``None``."""


@dataclass(frozen=True)
class Detection:
    """One recognised object on a canvas."""

    label: int
    confidence: float
    color: str | None
    centroid: tuple[float, float]
    """Ink-weighted centre (y, x) in pixels."""
    area: int
    bbox: BBox


def _bbox(mask: np.ndarray) -> BBox:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1


def _cut_pieces(mask: np.ndarray, axis: int, bounds: list[int]) -> list[np.ndarray]:
    """``mask`` cut between consecutive ``bounds`` along ``axis``; empty pieces are dropped."""
    out = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        index: list[slice] = [slice(None), slice(None)]
        index[axis] = slice(start, stop)
        piece = np.zeros_like(mask)
        piece[tuple(index)] = mask[tuple(index)]
        if piece.any():
            out.append(piece)
    return out


def _cut_candidates(profile: np.ndarray, lo: int, hi: int) -> list[tuple[float, list[int]]]:
    """Ways to cut lines [lo, hi) into ~DIGIT-long pieces with their costs, cheapest first.

    Boundary c cuts between lines c-1 and c, within 2 lines of the even split. Glyphs meet where
    ink is thin, but a thin stroke inside a glyph (the waist of a 3) is thin too, so moving away
    from the even split must buy a clearly thinner cut: each line of distance costs one
    typical line's ink. Costs are in units of that typical line.
    """
    pieces = max(2, int((hi - lo) / DIGIT + 0.5))
    line = profile[lo:hi].mean()
    candidates: list[tuple[float, list[int]]] = [(0.0, [lo])]
    for i in range(1, pieces):
        guess = lo + round(i * (hi - lo) / pieces)
        candidates = [(cost + profile[c - 1] + profile[c] + line * abs(c - guess), [*bounds, c])
                      for cost, bounds in candidates
                      for c in range(max(guess - 2, bounds[-1] + 1), min(guess + 3, hi))]
        # Keep the search small on long blobs of noise: the best few partial cuts suffice.
        candidates = sorted(candidates, key=lambda cb: cb[0])[:_MAX_CUTS]
    return [(cost / max(line, 1e-9), [*bounds, hi]) for cost, bounds in candidates]


Judge = Callable[[list[list[np.ndarray]], np.ndarray], int]
"""Picks the best of candidate splits (lists of piece masks), given their ink-profile costs."""


def _split_axis(mask: np.ndarray, ink: np.ndarray, axis: int, max_side: int,
                judge: Judge | None) -> list[np.ndarray]:
    """Split a component too long for one glyph along ``axis``; ``judge`` (if any) picks the cut."""
    profile = (ink * mask).sum(axis=1 - axis)
    occupied = np.flatnonzero(profile > 0)
    lo, hi = int(occupied[0]), int(occupied[-1]) + 1
    if hi - lo <= max_side:
        return [mask]
    candidates = _cut_candidates(profile, lo, hi)
    if not candidates:
        return [mask]
    splits = [_cut_pieces(mask, axis, bounds) for _, bounds in candidates]
    across = np.flatnonzero(mask.any(axis=axis))
    # Only a row of a few glyphs (one glyph thick across the row) is worth reading to cut.
    row_of_glyphs = across[-1] - across[0] < max_side and len(splits[0]) <= _MAX_JUDGED_PIECES
    if judge is None or len(splits) == 1 or not row_of_glyphs:
        return splits[0]
    return splits[judge(splits, np.asarray([cost for cost, _ in candidates]))]


def _legibility_judge(image: np.ndarray, recognizer: Recognizer) -> Judge:
    """A judge that weighs how confidently the recogniser reads the pieces against the ink
    profile (recognition-driven segmentation). Confidence alone is fooled: a recogniser never
    taught "half a digit" may read a shaved glyph confidently; the profile alone is fooled by
    thin strokes inside glyphs. Together they cut touching glyphs right most often."""

    def judge(splits: list[list[np.ndarray]], costs: np.ndarray) -> int:
        patches, counts = [], []
        for pieces in splits:
            patches.append(crop_patches(image, pieces))
            counts.append(len(pieces))
        _, confidence = recognizer.classify(np.concatenate(patches))
        logs = np.split(np.log(np.maximum(confidence, 1e-9)), np.cumsum(counts)[:-1])
        # Mean, not sum: a split that drops an empty piece must not win by having fewer terms.
        scores = np.asarray([chunk.mean() for chunk in logs]) - _PROFILE_WEIGHT * costs
        return int(np.argmax(scores))

    return judge


def _merge_fragments(masks: list[np.ndarray], merge_side: int) -> list[np.ndarray]:
    """Merge pieces whose joint box fits one glyph, tightest pair first, until none fit."""
    masks = list(masks)
    boxes = np.asarray([_bbox(m) for m in masks], np.int64).reshape(-1, 4)
    while len(masks) > 1:
        # All pairs at once: noisy canvases have dozens of specks.
        lo = np.minimum(boxes[:, None, :2], boxes[None, :, :2])
        hi = np.maximum(boxes[:, None, 2:], boxes[None, :, 2:])
        fits = ((hi - lo) <= merge_side).all(axis=-1)
        np.fill_diagonal(fits, False)
        if not fits.any():
            break
        area = np.where(fits, (hi - lo).prod(axis=-1), np.iinfo(np.int64).max)
        i, j = sorted(np.unravel_index(int(area.argmin()), area.shape))
        masks[i] = masks[i] | masks[j]
        boxes[i] = (*lo[i, j], *hi[i, j])
        del masks[j]
        boxes = np.delete(boxes, j, axis=0)
    return masks


def find_objects(image: np.ndarray, settings: DetectorSettings,
                 recognizer: Recognizer | None = None) -> list[np.ndarray]:
    """Boolean masks (H, W) of the objects on one canvas (not yet recognised).

    With a ``recognizer``, touching glyphs are cut where the pieces read best; without, where
    the ink is thinnest near an even split.
    """
    ink = image.max(axis=0)
    labels, count = ndimage.label(ink > settings.ink_threshold, structure=_EIGHT_CONNECTED)
    masks = [labels == i for i in range(1, count + 1)]
    masks = [m for m in masks if m.sum() >= settings.min_speck]
    judge = _legibility_judge(image, recognizer) if recognizer is not None else None
    pieces = [p for m in masks for tall in _split_axis(m, ink, 0, settings.max_side, judge)
              for p in _split_axis(tall, ink, 1, settings.max_side, judge)]
    merged = _merge_fragments(pieces, settings.merge_side)
    return [m for m in merged if m.sum() >= settings.min_area]


def crop_patches(image: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    """``(N, 3, PATCH, PATCH)`` crops centred on each object's box, other objects' ink blanked.

    Blanking keeps a neighbour's edge from changing the reading; faint ink below the threshold
    (owned by nobody) is kept, as the recogniser was trained with it.
    """
    owner = np.zeros(image.shape[1:], np.int32)
    for k, mask in enumerate(masks):
        owner[mask] = k + 1
    padded = np.pad(image, ((0, 0), (PATCH, PATCH), (PATCH, PATCH)))
    owner = np.pad(owner, PATCH)
    patches = np.empty((len(masks), 3, PATCH, PATCH), np.float32)
    for k, mask in enumerate(masks):
        y0, x0, y1, x1 = _bbox(mask)
        top = int(np.floor((y0 + y1 - 1) / 2 - (PATCH - 1) / 2 + 0.5)) + PATCH
        left = int(np.floor((x0 + x1 - 1) / 2 - (PATCH - 1) / 2 + 0.5)) + PATCH
        who = owner[top:top + PATCH, left:left + PATCH]
        patches[k] = padded[:, top:top + PATCH, left:left + PATCH]
        patches[k][:, (who != 0) & (who != k + 1)] = 0.0
    return patches


def ink_color(image: np.ndarray, mask: np.ndarray, tolerance: float) -> str | None:
    """Nearest named colour (palette or 'white') of an object's ink, or None when none is close.

    Pixels are ``intensity * colour``; sum(rgb) / sum(max channel) is the ink-weighted mean of
    each pixel's normalised colour, so faint edge pixels neither darken nor dominate it.
    """
    pixels = image[:, mask].astype(np.float64)
    rgb = pixels.sum(axis=1) / max(float(pixels.max(axis=0).sum()), 1e-9)
    distances = np.linalg.norm(_COLOR_RGB - rgb, axis=1)
    best = int(distances.argmin())
    return _COLOR_NAMES[best] if distances[best] <= tolerance else None


def _check_images(images: np.ndarray) -> np.ndarray:
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected canvases of shape (B, 3, H, W), got {images.shape}")
    bad = np.flatnonzero(~np.isfinite(images).reshape(len(images), -1).all(axis=1))
    if len(bad):
        raise ValueError(f"canvases {bad.tolist()} contain NaN or infinite pixels; "
                         "the sampler diverged before the reward was computed")
    return images


def detect_batch(images: np.ndarray, recognizer: Recognizer,
                 settings: DetectorSettings = DetectorSettings()) -> list[list[Detection]]:
    """Detections on each of ``(B, 3, H, W)`` canvases; one recogniser call for the whole batch."""
    images = _check_images(images)
    found: list[tuple[int, np.ndarray, BBox]] = []
    patches = [np.zeros((0, 3, PATCH, PATCH), np.float32)]
    for b, image in enumerate(images):
        masks = find_objects(image, settings, recognizer)
        found += [(b, m, _bbox(m)) for m in masks]
        patches.append(crop_patches(image, masks))
    labels, confidences = recognizer.classify(np.concatenate(patches))
    out: list[list[Detection]] = [[] for _ in images]
    for (b, mask, box), label, conf in zip(found, labels, confidences):
        if conf < settings.min_confidence:
            continue
        ink = images[b].max(axis=0) * mask
        cy, cx = ndimage.center_of_mass(ink)
        out[b].append(Detection(int(label), float(conf),
                                ink_color(images[b], mask, settings.color_tolerance),
                                (float(cy), float(cx)), int(mask.sum()), box))
    return out


def detect(image: np.ndarray, recognizer: Recognizer,
           settings: DetectorSettings = DetectorSettings()) -> list[Detection]:
    """Detections on one ``(3, H, W)`` canvas."""
    return detect_batch(np.asarray(image)[None], recognizer, settings)[0]


def string_of(detections: list[Detection]) -> str:
    """The digits of ``detections`` read left to right (OCR canvases hold one line)."""
    return "".join(str(d.label) for d in sorted(detections, key=lambda d: d.centroid[1]))


def read_string(image: np.ndarray, recognizer: Recognizer | None = None,
                settings: DetectorSettings = DetectorSettings()) -> str:
    """The digit string on one canvas; ``recognizer`` defaults to the cached default recogniser."""
    return string_of(detect(image, recognizer or load_or_train_recognizer(), settings))
