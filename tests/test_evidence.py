"""Paired-seed statistics: hand-computed cases."""
import pytest

from spotlight.evidence import (
    bootstrap_median,
    crossing,
    curve_area,
    first_crossing,
    paired_ratios,
    quantiles,
    value_at,
)

CURVE = [(0, 0.1), (5, 0.3), (10, 0.5), (15, 0.4)]


def test_first_crossing_and_value_at():
    assert first_crossing(CURVE, 0.3) == 5
    assert first_crossing(CURVE, 0.45) == 10
    assert first_crossing(CURVE, 0.9) is None
    assert value_at(CURVE, 10) == 0.5 and value_at(CURVE, 7) is None


def test_crossing_interpolates_between_validations():
    assert crossing(CURVE, 0.2) == pytest.approx(2.5)      # halfway from 0.1 at 0 to 0.3 at 5
    assert crossing(CURVE, 0.45) == pytest.approx(8.75)    # 0.3 at 5 -> 0.5 at 10
    assert crossing(CURVE, 0.1) == 0.0 and crossing(CURVE, 0.3) == pytest.approx(5.0)
    assert crossing(CURVE, 0.9) is None
    # The first crossing counts, not a later one after a dip.
    assert crossing([(0, 0.1), (5, 0.5), (10, 0.2), (15, 0.6)], 0.4) == pytest.approx(3.75)


def test_curve_area_is_the_mean_reward_over_the_budget():
    # Trapezoids: 0-5: 1.0, 5-10: 2.0 -> mean over 10 iterations 0.3.
    assert curve_area(CURVE, 10) == pytest.approx(0.3)
    # Held at its last value past the last point: + 5 x 0.4 over 20.
    assert curve_area(CURVE, 20) == pytest.approx((1.0 + 2.0 + 2.25 + 2.0) / 20)
    with pytest.raises(ValueError, match="until > 0"):
        curve_area(CURVE, 0)


def test_paired_ratios_drop_pairs_without_a_value():
    assert paired_ratios([10, 20, None, 9], [5, 10, 4, 3]) == [2.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="same seeds"):
        paired_ratios([1, 2], [1])


def test_bootstrap_interval_brackets_the_median_and_shrinks_with_agreement():
    spread = bootstrap_median([0.8, 1.2, 1.5, 2.0, 2.5, 1.1, 1.4, 1.9])
    lo, hi = spread["ci90"]
    assert spread["median"] == pytest.approx(1.45)
    assert lo <= spread["median"] <= hi and lo < hi
    same = bootstrap_median([1.5] * 8)
    assert same["ci90"] == [1.5, 1.5]
    assert bootstrap_median([1.7]) == {"median": 1.7, "ci90": [1.7, 1.7], "per_seed": [1.7]}
    assert bootstrap_median([])["median"] is None
    # Deterministic: the same seeds give the same interval.
    assert bootstrap_median([0.8, 1.2, 1.5])["ci90"] == bootstrap_median([0.8, 1.2, 1.5])["ci90"]


def test_quantiles_skip_missing_values():
    assert quantiles([None, 1.0, 2.0, 3.0, float("nan")], 0.5, 0.1) == [2.0, pytest.approx(1.2)]
    assert quantiles([None], 0.5) == [None]


def test_paired_gain_is_the_mean_difference_with_an_interval_around_it():
    from spotlight.evidence import paired_gain

    out = paired_gain([0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.6])
    assert out["gain"] == pytest.approx(0.125)
    lo, hi = out["ci90"]
    assert 0.1 - 1e-9 <= lo <= out["gain"] <= hi <= 0.2 + 1e-9   # the smallest and largest pair
    # The prompts' own spread cancels: the same gain on every pair has no width.
    assert paired_gain([0.0, 0.5, 0.9], [0.1, 0.6, 1.0])["ci90"] == pytest.approx([0.1, 0.1])
    assert paired_gain([0.3], [0.2]) == {"gain": pytest.approx(-0.1),
                                         "ci90": [pytest.approx(-0.1), pytest.approx(-0.1)]}
    with pytest.raises(ValueError, match="same samples"):
        paired_gain([0.1, 0.2], [0.1])
