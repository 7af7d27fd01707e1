"""GenEval partial credit: unit cases on hand-made detections, then on rendered canvases."""
from __future__ import annotations

import numpy as np
import pytest

from spotlight.config import RewardConfig
from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.models.world import render_geneval
from spotlight.rewards import Detection, build_reward, detect, geneval_score
from spotlight.rewards.geneval import clause_terms, relation_holds, strict_scores
from spotlight.rewards.recognizer import Recognizer

TWO_RED_3S = Prompt("two red 3s", "geneval", tag="counting",
                    include=(ObjectClause("3", count=2, color="red"),))
THREE_LEFT_OF_5 = Prompt("a 3 left of a 5", "geneval", tag="position",
                         include=(ObjectClause("5"), ObjectClause("3", position=("left of", 0))))


def det(label: int, color: str | None, y: float, x: float) -> Detection:
    box = (int(y) - 4, int(x) - 4, int(y) + 4, int(x) + 4)
    return Detection(label, 0.99, color, (y, x), 20, box)


def test_perfect_detections_score_one() -> None:
    assert geneval_score([det(3, "red", 5, 5), det(3, "red", 5, 16)], TWO_RED_3S) == 1.0
    assert geneval_score([det(3, "green", 5, 5), det(5, "red", 5, 16)], THREE_LEFT_OF_5) == 1.0


def test_count_colour_and_position_terms() -> None:
    # One of two 3s: count 1/2; the one found is red: colour 1.
    assert clause_terms([det(3, "red", 5, 5)], TWO_RED_3S) == [0.5, 1.0]
    # Three 3s, one blue: count 1 - 1/2, colour 2/3; other digits are ignored.
    three = [det(3, "red", 5, 5), det(3, "red", 5, 16), det(3, "blue", 15, 5),
             det(7, "red", 15, 16)]
    assert clause_terms(three, TWO_RED_3S) == pytest.approx([0.5, 2 / 3])
    # Nothing found: zero count and zero colour, never a division by zero.
    assert clause_terms([], TWO_RED_3S) == [0.0, 0.0]
    # Count overshoot beyond twice the target is clipped at zero.
    many = [det(5, None, 5, 5)] * 3
    assert clause_terms(many, Prompt("a 5", "geneval", include=(ObjectClause("5"),))) == [0.0]
    # 3 right of the 5: both counts right, position wrong.
    wrong_side = [det(3, None, 5, 16), det(5, None, 5, 5)]
    assert clause_terms(wrong_side, THREE_LEFT_OF_5) == [1.0, 1.0, 0.0]
    # The best pair decides: a second 3 on the left satisfies the relation (the count of 3s,
    # two for one wanted, scores 0).
    both = [det(3, None, 5, 27), det(5, None, 5, 16), det(3, None, 5, 5)]
    assert clause_terms(both, THREE_LEFT_OF_5) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("relation, subject, other, holds", [
    ("left of", (5, 5), (5, 16), True), ("left of", (5, 14), (5, 16), False),
    ("right of", (5, 16), (5, 5), True), ("above", (5, 10), (15, 10), True),
    ("below", (5, 10), (15, 10), False), ("below", (15, 10), (5, 10), True),
])
def test_relation_holds(relation: str, subject: tuple, other: tuple, holds: bool) -> None:
    assert relation_holds(relation, subject, other) is holds


def _mean_reward(reward, canvas_prompt: Prompt, scored_prompt: Prompt, n: int = 12) -> float:
    rng = np.random.default_rng(11)
    images = np.stack([render_geneval(canvas_prompt, 20, 32, rng) for _ in range(n)])
    return float(reward(images, [scored_prompt] * n).mean())


def with_clause(prompt: Prompt, index: int, **changes: object) -> Prompt:
    """``prompt`` with clause ``index`` changed (a wrong canvas is a different prompt rendered)."""
    clauses = list(prompt.include)
    clauses[index] = ObjectClause(**{**clauses[index].__dict__, **changes})
    return Prompt(prompt.text + " (altered)", "geneval", tag=prompt.tag, include=tuple(clauses))


@pytest.mark.parametrize("prompt, wrong, expected_wrong", [
    (TWO_RED_3S, with_clause(TWO_RED_3S, 0, count=3), 0.75),           # count term 1/2
    (TWO_RED_3S, with_clause(TWO_RED_3S, 0, count=1), 0.75),
    (TWO_RED_3S, with_clause(TWO_RED_3S, 0, color="green"), 0.5),      # colour term 0
    (THREE_LEFT_OF_5, with_clause(THREE_LEFT_OF_5, 1, position=("right of", 0)), 2 / 3),
    (with_clause(THREE_LEFT_OF_5, 1, position=("above", 0)),
     with_clause(THREE_LEFT_OF_5, 1, position=("below", 0)), 2 / 3),
    (Prompt("a yellow 0 and a blue 8", "geneval", tag="color_attr",
            include=(ObjectClause("0", color="yellow"), ObjectClause("8", color="blue"))),
     Prompt("a blue 0 and a yellow 8", "geneval", tag="color_attr",
            include=(ObjectClause("0", color="blue"), ObjectClause("8", color="yellow"))), 0.5),
], ids=["too-many", "too-few", "wrong-colour", "wrong-side", "wrong-row", "swapped-colours"])
def test_rendered_canvases_score_right_above_wrong(recognizer: Recognizer, prompt: Prompt,
                                                   wrong: Prompt, expected_wrong: float) -> None:
    reward = build_reward(RewardConfig(name="geneval"))
    right = _mean_reward(reward, prompt, prompt)
    bad = _mean_reward(reward, wrong, prompt)
    assert right >= 0.95
    assert bad == pytest.approx(expected_wrong, abs=0.1)
    assert bad < right - 0.2


def test_detector_finds_coloured_objects(recognizer: Recognizer) -> None:
    rng = np.random.default_rng(3)
    prompt = Prompt("a red 4 and a blue 7", "geneval",
                    include=(ObjectClause("4", color="red"), ObjectClause("7", color="blue")))
    hits = 0
    for _ in range(10):
        found = detect(render_geneval(prompt, 20, 32, rng), recognizer)
        hits += sorted((d.label, d.color) for d in found) == [(4, "red"), (7, "blue")]
    assert hits >= 9


def test_strict_scores_pass_an_image_only_when_every_term_is_right():
    counting = Prompt("two red 3s", "geneval", tag="counting")
    position = Prompt("a 3 left of a 5", "geneval", tag="position")
    rewards = [[1.0, 0.5, 1.0, 0.0],      # counting: 2 of 4 pass
               [0.75, 0.75, 1.0, 1.0]]    # position: 2 of 4 pass (0.75 is partial credit)
    scores = strict_scores(rewards, [counting, position])
    assert scores["strict_by_tag"] == {"counting": 0.5, "position": 0.5}
    assert scores["strict"] == 0.5
    assert scores["partial_mean"] == pytest.approx((2.5 + 3.5) / 8)
    with pytest.raises(ValueError, match="2 rows of rewards for 1 prompts"):
        strict_scores(rewards, [counting])
