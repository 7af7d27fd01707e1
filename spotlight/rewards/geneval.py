"""GenEval's checks as partial credit on the digits world: count, colour and position per clause.

GenEval passes or fails a whole image; RL needs a graded signal, so each check becomes a term in
[0, 1] and the reward is the mean of all terms of all clauses:

- count: ``max(0, 1 - |want - found| / want)``, found = detected objects of the clause's digit;
- colour (when named): the fraction of those objects in that colour (0 when none was found);
- position (when given as ``[relation, j]``): 1 if some detected pair of this clause's digit and
  clause j's digit stands in the relation by more than ``margin`` pixels, else 0.
"""
from __future__ import annotations

from spotlight.models.prompts import Prompt
from spotlight.rewards.base import DetectionReward
from spotlight.rewards.detect import Detection
from spotlight.rewards.registry import register_reward

POSITION_MARGIN = 3.0
"""Pixels by which centres must differ for a relation to hold: a third of a digit, so objects
side by side in neighbouring slots (>= 8 px apart) pass and overlapping ones do not."""


def relation_holds(relation: str, subject: tuple[float, float], other: tuple[float, float],
                   margin: float = POSITION_MARGIN) -> bool:
    """Whether the object centred at ``subject`` (y, x) is ``relation`` the one at ``other``."""
    (sy, sx), (oy, ox) = subject, other
    checks = {"left of": ox - sx, "right of": sx - ox, "above": oy - sy, "below": sy - oy}
    if relation not in checks:
        raise ValueError(f"unknown relation {relation!r}; expected one of {sorted(checks)}")
    return checks[relation] > margin


def clause_terms(detections: list[Detection], prompt: Prompt,
                 margin: float = POSITION_MARGIN) -> list[float]:
    """The partial-credit terms of every clause of a geneval prompt, in clause order."""
    if not prompt.include:
        raise ValueError(f"geneval prompt {prompt.text!r} has no 'include' clauses to check")
    of_class = {c.cls: [d for d in detections if str(d.label) == c.cls] for c in prompt.include}
    terms: list[float] = []
    for clause in prompt.include:
        mine = of_class[clause.cls]
        terms.append(max(0.0, 1.0 - abs(clause.count - len(mine)) / clause.count))
        if clause.color is not None:
            terms.append(sum(d.color == clause.color for d in mine) / len(mine) if mine else 0.0)
        if clause.position is not None:
            relation, j = clause.position
            theirs = of_class[prompt.include[j].cls]
            # Best-matching pair: the relation holds for any pair of distinct detections.
            held = any(a is not b and relation_holds(relation, a.centroid, b.centroid, margin)
                       for a in mine for b in theirs)
            terms.append(1.0 if held else 0.0)
    return terms


def geneval_score(detections: list[Detection], prompt: Prompt,
                  margin: float = POSITION_MARGIN) -> float:
    """Mean of ``clause_terms``: 1 when every count, colour and position is right."""
    terms = clause_terms(detections, prompt, margin)
    return sum(terms) / len(terms)


def strict_scores(rewards, prompts: list[Prompt]) -> dict:
    """GenEval's own verdict beside the partial credit: an image passes only when every term of
    every clause is right (reward 1). ``rewards`` has one row per prompt (its validation seeds);
    returns the pass rate overall and per prompt tag (single object, two objects, counting,
    colours, position, colour attribution), and the partial-credit mean."""
    rows = [list(map(float, row)) for row in rewards]
    if len(rows) != len(prompts):
        raise ValueError(f"strict_scores: {len(rows)} rows of rewards for {len(prompts)} prompts")
    by_tag: dict[str, list[float]] = {}
    for row, prompt in zip(rows, prompts):
        by_tag.setdefault(prompt.tag or "untagged", []).extend(
            1.0 if r >= 1.0 - 1e-9 else 0.0 for r in row)
    passed = [x for xs in by_tag.values() for x in xs]
    return {"strict": sum(passed) / len(passed),
            "strict_by_tag": {tag: sum(xs) / len(xs) for tag, xs in sorted(by_tag.items())},
            "partial_mean": sum(map(sum, rows)) / sum(map(len, rows))}


@register_reward("geneval")
class GenevalReward(DetectionReward):
    """Scores each canvas's detections with ``geneval_score`` against its prompt's clauses."""

    name = "geneval"
    task = "geneval"

    def score(self, detections: list[Detection], prompt: Prompt) -> float:
        return geneval_score(detections, prompt)
