"""The embedded digits world: canvases composed from scikit-learn's bundled handwritten digits.

Canvases are float32 arrays ``(3, H, W)`` in [0, 1] (black background). OCR canvases hold a
white digit string on one line; geneval canvases hold coloured digit objects in a 2 x 3 grid of
slots, so positions ("left of", "above") and counts are well defined. Everything is deterministic
given a ``numpy.random.Generator``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from spotlight.models.prompts import MAX_OCR_DIGITS, PALETTE, ObjectClause, Prompt

DIGIT = 8  # side of a scikit-learn digit image
OCR_INK = (1.0, 1.0, 1.0)
OCR_TEMPLATES = (
    'a sign that says "{}"',
    'the number "{}" written on a wall',
    'a poster with the text "{}"',
    'a door plate showing "{}"',
    'a price tag reading "{}"',
    'a jersey with the number "{}"',
)
NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}


@lru_cache(maxsize=1)
def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 bundled 8x8 digits as float32 in [0, 1], with their labels (nothing is
    downloaded)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


@lru_cache(maxsize=8)
def _by_class(glyphs: int = 0) -> tuple[np.ndarray, ...]:
    images, labels = digit_images()
    pools = tuple(np.flatnonzero(labels == d) for d in range(10))
    return tuple(pool[:glyphs] if glyphs else pool for pool in pools)


def sample_digit(digit: int, rng: np.random.Generator, glyphs: int = 0) -> np.ndarray:
    """A random handwritten instance of ``digit`` (8x8, [0, 1]) from the first ``glyphs`` of its
    class (0 = all ~180)."""
    pool = _by_class(glyphs)[digit]
    return digit_images()[0][pool[rng.integers(len(pool))]]


def paste(canvas: np.ndarray, glyph: np.ndarray, color: tuple[float, float, float],
          y: int, x: int) -> None:
    """Paste an 8x8 intensity glyph in ``color`` at (y, x); overlaps keep the brighter ink."""
    region = canvas[:, y:y + DIGIT, x:x + DIGIT]
    np.maximum(region, glyph[None] * np.asarray(color, np.float32)[:, None, None], out=region)


def render_ocr(target: str, height: int, width: int, rng: np.random.Generator,
               glyphs: int = 0) -> np.ndarray:
    """A white digit string on the canvas's middle line, left-aligned, with small jitter.

    The layout varies little on purpose: the k-th digit of every target lands in the same
    column band, so the base model's few minutes of pretraining go to glyphs and to binding
    digits to the prompt rather than to working out where a string of some length is centred.
    """
    canvas = np.zeros((3, height, width), np.float32)
    gap = 1
    span = DIGIT * len(target) + gap * (len(target) - 1)
    x = int(np.clip(2 + rng.integers(-1, 2), 0, width - span))
    y = int(np.clip((height - DIGIT) // 2 + rng.integers(-1, 2), 0, height - DIGIT))
    for ch in target:
        paste(canvas, sample_digit(int(ch), rng, glyphs), OCR_INK, y, x)
        x += DIGIT + gap
    return canvas


def slot_origins(height: int, width: int) -> tuple[list[int], list[int]]:
    """Top-left corners of the 2 rows x 3 columns of object slots."""
    rows = [1, height - DIGIT - 1]
    cols = [int(round(c)) for c in np.linspace(1, width - DIGIT - 1, 3)]
    return rows, cols


def _place(prompt: Prompt, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Choose (row, col) slots for every object of a geneval prompt, honouring its position."""
    n_objects = sum(c.count for c in prompt.include)
    relation = next((c.position for c in prompt.include if c.position), None)
    if relation is None:
        cells = [(r, c) for r in range(2) for c in range(3)]
        picks = rng.choice(len(cells), size=n_objects, replace=False)
        return [cells[i] for i in picks]
    # Two single objects; include[1] stands in `relation` to include[0].
    name = relation[0]
    if name in ("left of", "right of"):
        row = int(rng.integers(2))
        a, b = sorted(rng.choice(3, size=2, replace=False))
        subject, other = ((row, a), (row, b)) if name == "left of" else ((row, b), (row, a))
    else:
        col = int(rng.integers(3))
        subject, other = ((0, col), (1, col)) if name == "above" else ((1, col), (0, col))
    return [other, subject]


def render_geneval(prompt: Prompt, height: int, width: int, rng: np.random.Generator,
                   glyphs: int = 0) -> np.ndarray:
    """Coloured digit objects in slots; unspecified colours are drawn from the palette."""
    canvas = np.zeros((3, height, width), np.float32)
    rows, cols = slot_origins(height, width)
    objects = [(c.cls, c.color) for c in prompt.include for _ in range(c.count)]
    colors = list(PALETTE)
    for (cls, color), (r, c) in zip(objects, _place(prompt, rng)):
        color = color or colors[int(rng.integers(len(colors)))]
        y = int(np.clip(rows[r] + rng.integers(-1, 2), 0, height - DIGIT))
        x = int(np.clip(cols[c] + rng.integers(-1, 2), 0, width - DIGIT))
        paste(canvas, sample_digit(int(cls), rng, glyphs), PALETTE[color], y, x)
    return canvas


def render(prompt: Prompt, height: int, width: int, rng: np.random.Generator,
           glyphs: int = 0) -> np.ndarray:
    if prompt.task == "ocr":
        return render_ocr(prompt.target, height, width, rng, glyphs)
    return render_geneval(prompt, height, width, rng, glyphs)


# --- random prompts (pretraining data and prompt-file generation) ---------------------------

def random_ocr_prompt(rng: np.random.Generator) -> Prompt:
    n = int(rng.integers(1, MAX_OCR_DIGITS + 1))
    target = "".join(str(d) for d in rng.integers(0, 10, size=n))
    template = OCR_TEMPLATES[int(rng.integers(len(OCR_TEMPLATES)))]
    return Prompt(text=template.format(target), task="ocr", target=target)


def _noun(clause: ObjectClause) -> str:
    color = f"{clause.color} " if clause.color else ""
    plural = "s" if clause.count > 1 else ""
    return f"{NUMBER_WORDS[clause.count]} {color}{clause.cls}{plural}"


def describe(tag: str, include: tuple[ObjectClause, ...]) -> str:
    """GenEval-style prompt text for a tag and its object clauses."""
    if tag == "position":
        return f"{_noun(include[1])} {include[1].position[0]} {_noun(include[0])}"
    return " and ".join(_noun(c) for c in include)


def random_geneval_prompt(rng: np.random.Generator) -> Prompt:
    tags = ("single_object", "colors", "counting", "two_object", "color_attr", "position")
    tag = tags[int(rng.integers(len(tags)))]
    colors = sorted(PALETTE)
    digits = [str(d) for d in rng.choice(10, size=2, replace=False)]
    pick_color = lambda: colors[int(rng.integers(len(colors)))]  # noqa: E731
    if tag == "single_object":
        include = (ObjectClause(digits[0]),)
    elif tag == "colors":
        include = (ObjectClause(digits[0], color=pick_color()),)
    elif tag == "counting":
        color = pick_color() if rng.random() < 0.5 else None
        include = (ObjectClause(digits[0], count=int(rng.integers(2, 4)), color=color),)
    elif tag == "two_object":
        include = (ObjectClause(digits[0]), ObjectClause(digits[1]))
    elif tag == "color_attr":
        a, b = rng.choice(len(colors), size=2, replace=False)
        include = (ObjectClause(digits[0], color=colors[a]),
                   ObjectClause(digits[1], color=colors[b]))
    else:
        relation = ("left of", "right of", "above", "below")[int(rng.integers(4))]
        include = (ObjectClause(digits[0]), ObjectClause(digits[1], position=(relation, 0)))
    return Prompt(text=describe(tag, include), task="geneval", tag=tag, include=include)


def random_prompt(task: str, rng: np.random.Generator) -> Prompt:
    return random_ocr_prompt(rng) if task == "ocr" else random_geneval_prompt(rng)


def to_model_space(canvas: np.ndarray) -> np.ndarray:
    """[0, 1] pixels -> [-1, 1], the space the policy denoises in."""
    return canvas * 2.0 - 1.0


def to_pixels(x: np.ndarray) -> np.ndarray:
    """[-1, 1] model space -> [0, 1] pixels, clipped."""
    return np.clip((x + 1.0) * 0.5, 0.0, 1.0)
