"""Flow-GRPO's OCR score, and reading rendered OCR canvases."""
from __future__ import annotations

import numpy as np
import pytest

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.models.world import random_ocr_prompt, render_ocr
from spotlight.rewards import build_reward, levenshtein, ocr_score, read_string
from spotlight.rewards.recognizer import Recognizer


@pytest.mark.parametrize("a, b, distance", [
    ("", "", 0), ("", "abc", 3), ("407", "407", 0), ("407", "401", 1), ("407", "47", 1),
    ("kitten", "sitting", 3), ("123", "321", 2), ("14079", "407", 2),
])
def test_levenshtein(a: str, b: str, distance: int) -> None:
    assert levenshtein(a, b) == distance == levenshtein(b, a)


def test_exact_match_scores_one() -> None:
    assert ocr_score("407", "407") == 1.0


def test_target_inside_recognised_text_scores_one() -> None:
    assert ocr_score("14079", "407") == 1.0


def test_empty_recognition_scores_zero() -> None:
    assert ocr_score("", "407") == 0.0


def test_non_digit_text_is_scored_as_a_string() -> None:
    assert ocr_score("abc", "407") == 0.0
    assert ocr_score("4o7", "407") == pytest.approx(2 / 3)
    assert ocr_score("Sign 407", "407") == 1.0


def test_one_edit_away() -> None:
    assert ocr_score("401", "407") == pytest.approx(2 / 3)   # substitution
    assert ocr_score("47", "407") == pytest.approx(2 / 3)    # deletion
    assert ocr_score("4707", "407") == pytest.approx(2 / 3)  # insertion, not a substring
    assert ocr_score("5", "7") == 0.0                        # one edit is all of a 1-digit target


def test_distance_is_capped_at_target_length() -> None:
    assert ocr_score("123456789", "00") == 0.0


def test_read_string_reads_rendered_targets(recognizer: Recognizer) -> None:
    rng = np.random.default_rng(2024)
    targets = [random_ocr_prompt(rng).target for _ in range(50)]
    read = [read_string(render_ocr(t, 12, 32, rng), recognizer) for t in targets]
    correct = sum(r == t for r, t in zip(read, targets))
    assert correct >= 45, list(zip(targets, read))


def test_blank_canvas_reads_nothing(recognizer: Recognizer) -> None:
    assert read_string(np.zeros((3, 12, 32), np.float32), recognizer) == ""


def test_ocr_reward_prefers_the_prompted_string(recognizer: Recognizer) -> None:
    reward = build_reward(RewardConfig(name="ocr"))
    rng = np.random.default_rng(7)
    prompts = [random_ocr_prompt(rng) for _ in range(32)]
    images = np.stack([render_ocr(p.target, 12, 32, rng) for p in prompts])
    matched = reward(images, prompts)
    assert matched.shape == (32,) and matched.dtype == np.float64
    assert np.all((matched >= 0) & (matched <= 1))
    assert matched.mean() >= 0.95
    shifted = reward(images, prompts[1:] + prompts[:1])
    assert shifted.mean() < matched.mean() - 0.4
    blank = reward(np.zeros_like(images[:1]), [Prompt("a sign", "ocr", target="407")])
    assert blank.tolist() == [0.0]


def test_dense_ocr_ranks_canvases_that_plain_ocr_scores_alike(recognizer: Recognizer) -> None:
    """Plain OCR gives every illegible canvas 0; the dense reward still orders them by how much
    the target's glyphs show where the world writes them, and agrees with OCR on legible ones."""
    dense = build_reward(RewardConfig(name="ocr-dense"))
    plain = build_reward(RewardConfig(name="ocr"))
    rng = np.random.default_rng(3)
    prompts = [random_ocr_prompt(rng) for _ in range(16)]
    clean = np.stack([render_ocr(p.target, 12, 32, rng) for p in prompts])
    assert np.all(dense(clean, prompts) > 0.9) and np.all(plain(clean, prompts) >= 0.9)
    # Faded towards noise: unreadable, so OCR is 0, but the fainter the glyphs the lower.
    noise = rng.random(clean.shape).astype(np.float32) * 0.25
    faint = [np.clip(a * clean + noise, 0, 1) for a in (0.0, 0.025, 0.05)]
    assert [plain(f, prompts).max() for f in faint] == [0.0, 0.0, 0.0]
    means = [dense(f, prompts).mean() for f in faint]
    assert means[0] < means[1] < means[2], means
    scores = dense(faint[0], prompts)
    assert len(set(scores.round(12).tolist())) == len(scores)   # no two tie
    assert np.all((scores >= 0) & (scores <= 0.25))           # the dense part's share


def test_dense_ocr_refuses_what_ocr_refuses() -> None:
    dense = build_reward(RewardConfig(name="ocr-dense"))
    with pytest.raises(ValueError, match="expects canvases of shape"):
        dense(np.zeros((2, 12, 32), np.float32), [Prompt("a", "ocr", target="1")] * 2)
