import numpy as np
from scipy import ndimage

from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.models.world import (
    digit_images,
    random_geneval_prompt,
    random_ocr_prompt,
    render_geneval,
    render_ocr,
    sample_digit,
)


def test_digits_come_from_the_bundled_data_set():
    images, labels = digit_images()
    assert images.shape == (1797, 8, 8) and images.max() <= 1.0 and set(labels) == set(range(10))


def test_glyph_pool_limits_handwriting_styles():
    rng = np.random.default_rng(0)
    seen = {sample_digit(3, rng, glyphs=2).tobytes() for _ in range(50)}
    assert len(seen) == 2
    assert len({sample_digit(3, rng).tobytes() for _ in range(50)}) > 10


def test_ocr_canvas_holds_the_digits_left_to_right():
    canvas = render_ocr("407", 12, 32, np.random.default_rng(1))
    assert canvas.shape == (3, 12, 32) and 0.0 <= canvas.min() and canvas.max() <= 1.0
    ink_columns = canvas.max(axis=(0, 1)) > 0.05
    assert ink_columns.sum() >= 12  # three glyphs' worth of inked columns


def _centroid(canvas, color_channel):
    mask = (canvas[color_channel] > 0.5) & (canvas.sum(0) < 2.5)
    return np.array(ndimage.center_of_mass(mask))


def test_geneval_positions_follow_genevals_convention():
    # include[1] stands "left of" include[0]: red 5 must be left of blue 3.
    prompt = Prompt(text="a red 5 left of a blue 3", task="geneval", tag="position",
                    include=(ObjectClause("3", color="blue"),
                             ObjectClause("5", color="red", position=("left of", 0))))
    for seed in range(10):
        canvas = render_geneval(prompt, 20, 32, np.random.default_rng(seed))
        red, blue = _centroid(canvas, 0), _centroid(canvas, 2)
        assert red[1] < blue[1]


def test_random_prompts_cover_every_tag():
    rng = np.random.default_rng(0)
    tags = {random_geneval_prompt(rng).tag for _ in range(200)}
    assert tags == {"single_object", "colors", "counting", "two_object", "color_attr", "position"}
    assert all(1 <= len(random_ocr_prompt(rng).target) <= 3 for _ in range(50))
