"""GenEval's clauses on constructed detections: count, exclusion (exact counts), colour, position
with its margin, colour attribution across two objects, and the partial credit per clause."""
from __future__ import annotations

import pytest

from spotlight.rewards.geneval_image import (
    Box,
    by_class,
    clause_results,
    geneval_image_score,
    relations,
)


def box(label, x, y, w=10.0, h=10.0, score=0.9):
    return Box(label, score, (x - w / 2, y - h / 2, x + w / 2, y + h / 2))


def colours(mapping):
    """A colour classifier that reads each object's colour from a dict keyed by its centre."""
    return lambda objects, cls: [mapping[o.centre] for o in objects]


NO_COLOURS = colours({})


def test_single_object_and_the_confidence_threshold():
    record = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    assert clause_results(record, [box("dog", 50, 50)], NO_COLOURS) == [True]
    assert clause_results(record, [box("dog", 50, 50, score=0.29)], NO_COLOURS) == [False]
    assert clause_results(record, [box("cat", 50, 50)], NO_COLOURS) == [False]


def test_counting_is_exact_through_its_exclude_clause():
    record = {"tag": "counting", "include": [{"class": "apple", "count": 3}],
              "exclude": [{"class": "apple", "count": 4}]}
    three = [box("apple", x, 50) for x in (10, 40, 70)]
    assert clause_results(record, three, NO_COLOURS) == [True, True]
    assert clause_results(record, three + [box("apple", 90, 50)], NO_COLOURS) == [True, False]
    assert geneval_image_score(record, three[:2], NO_COLOURS) == 0.5   # too few, none extra


def test_two_objects_score_one_share_each():
    record = {"tag": "two_object", "include": [{"class": "cup", "count": 1},
                                               {"class": "bench", "count": 1}]}
    assert geneval_image_score(record, [box("cup", 20, 20)], NO_COLOURS) == 0.5
    assert geneval_image_score(record, [box("cup", 20, 20), box("bench", 60, 60)],
                               NO_COLOURS) == 1.0


def test_colour_is_checked_on_the_most_confident_objects():
    record = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    sure, unsure = box("car", 20, 20, score=0.9), box("car", 60, 60, score=0.5)
    paint = colours({sure.centre: "blue", unsure.centre: "red"})
    assert clause_results(record, [sure, unsure], paint) == [False]   # the top one is blue
    paint = colours({sure.centre: "red", unsure.centre: "blue"})
    assert clause_results(record, [sure, unsure], paint) == [True]


def test_colour_attribution_needs_each_object_in_its_own_colour():
    record = {"tag": "color_attr", "include": [{"class": "cup", "count": 1, "color": "red"},
                                               {"class": "vase", "count": 1, "color": "green"}]}
    cup, vase = box("cup", 20, 20), box("vase", 60, 60)
    assert clause_results(record, [cup, vase],
                          colours({cup.centre: "red", vase.centre: "green"})) == [True, True]
    assert clause_results(record, [cup, vase],
                          colours({cup.centre: "green", vase.centre: "red"})) == [False, False]


def test_position_uses_the_margin_and_needs_its_anchor_clause():
    record = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                             {"class": "cat", "count": 1,
                                              "position": ["left of", 0]}]}
    dog = box("dog", 60, 50)
    assert clause_results(record, [dog, box("cat", 20, 50)], NO_COLOURS) == [True, True]
    assert clause_results(record, [dog, box("cat", 90, 50)], NO_COLOURS) == [True, False]
    # Centres 0.5 px apart with 10 px boxes: inside the 10% margin, so not "left of".
    assert clause_results(record, [dog, box("cat", 59.5, 50)], NO_COLOURS) == [True, False]
    # Without the dog the relation has no anchor: both clauses fail.
    assert clause_results(record, [box("cat", 20, 50)], NO_COLOURS) == [False, False]


def test_relations_and_grouping():
    a, b = box("a", 10, 10), box("b", 50, 60)
    assert relations(a, b) == {"left of", "above"} and relations(b, a) == {"right of", "below"}
    found = by_class([box("a", 0, 0, score=0.4), box("a", 5, 5, score=0.8),
                      box("b", 1, 1, score=0.1)])
    assert [b.score for b in found["a"]] == [0.8, 0.4] and "b" not in found


def test_a_record_without_clauses_is_an_error():
    with pytest.raises(ValueError, match="no clauses"):
        clause_results({"prompt": "nothing"}, [], NO_COLOURS)
