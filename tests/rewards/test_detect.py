"""The classical detector: splitting touching glyphs, merging fragments, specks and colours."""
from __future__ import annotations

import numpy as np
import pytest

from spotlight.models.prompts import PALETTE
from spotlight.models.world import paste, sample_digit
from spotlight.rewards import DetectorSettings, detect
from spotlight.rewards.detect import find_objects, ink_color
from spotlight.rewards.recognizer import Recognizer


def test_touching_digits_in_a_row_are_split(recognizer: Recognizer) -> None:
    rng = np.random.default_rng(0)
    correct = 0
    for _ in range(30):
        digits = rng.integers(0, 10, size=3)
        canvas = np.zeros((3, 12, 32), np.float32)
        for i, d in enumerate(digits):  # no gaps: neighbouring glyphs may touch
            paste(canvas, sample_digit(int(d), rng), (1.0, 1.0, 1.0), 2, 3 + 8 * i)
        found = sorted(detect(canvas, recognizer), key=lambda d: d.centroid[1])
        correct += [d.label for d in found] == digits.tolist()
    assert correct >= 27


def test_stacked_touching_digits_are_split(recognizer: Recognizer) -> None:
    rng = np.random.default_rng(1)
    correct = 0
    for _ in range(30):
        top, bottom = rng.integers(0, 10, size=2)
        canvas = np.zeros((3, 20, 32), np.float32)
        paste(canvas, sample_digit(int(top), rng), PALETTE["red"], 2, 12)
        paste(canvas, sample_digit(int(bottom), rng), PALETTE["blue"], 10, 12)
        found = sorted(detect(canvas, recognizer), key=lambda d: d.centroid[0])
        correct += [(d.label, d.color) for d in found] == [(top, "red"), (bottom, "blue")]
    assert correct >= 27


def test_broken_glyph_is_one_object(recognizer: Recognizer) -> None:
    canvas = np.zeros((3, 20, 32), np.float32)
    glyph = sample_digit(7, np.random.default_rng(2)).copy()
    glyph[3] = 0.0  # a gap across the stroke: two components, one digit
    paste(canvas, glyph, PALETTE["green"], 6, 12)
    assert len(find_objects(canvas, DetectorSettings())) == 1
    (found,) = detect(canvas, recognizer)
    assert found.color == "green" and found.area >= 10
    assert 6 <= found.centroid[0] <= 14 and 12 <= found.centroid[1] <= 20


def test_specks_and_faint_noise_are_ignored(recognizer: Recognizer) -> None:
    rng = np.random.default_rng(3)
    canvas = np.zeros((3, 20, 32), np.float32)
    for y, x in zip(rng.integers(0, 20, 12), rng.integers(0, 32, 12)):
        canvas[:, y, x] = 1.0  # isolated bright pixels
    canvas += rng.uniform(0.0, 0.2, canvas.shape).astype(np.float32)  # faint haze
    assert detect(canvas, recognizer) == []


@pytest.mark.parametrize("name", [*PALETTE, "white"])
def test_ink_colour_names(name: str) -> None:
    rgb = np.asarray(PALETTE.get(name, (1.0, 1.0, 1.0)), np.float32)
    glyph = sample_digit(8, np.random.default_rng(4))
    image = glyph[None] * rgb[:, None, None]
    assert ink_color(image, glyph > 0.3, tolerance=0.45) == name


def test_unnamed_colour_is_none() -> None:
    glyph = sample_digit(8, np.random.default_rng(5))
    magenta = glyph[None] * np.asarray([1.0, 0.1, 1.0], np.float32)[:, None, None]
    assert ink_color(magenta, glyph > 0.3, tolerance=0.45) is None
