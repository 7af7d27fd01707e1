"""What each run mode means, asked of the Mode rather than of its name."""
from __future__ import annotations

import pytest

from spotlight.config import RunConfig
from spotlight.exploration.selection import seed_source
from spotlight.modes import MODE_NAMES, MODES, RLBOOST, SPOTLIGHT, SYNC, VANILLA, mode_of


def test_the_four_modes_and_what_they_do():
    assert MODE_NAMES == ("spotlight", "sync", "vanilla", "rlboost")
    assert [(m.explores, m.stale, m.rollout_on_spot, m.hybrid_rollout)
            for m in (SPOTLIGHT, SYNC, VANILLA, RLBOOST)] == [
        (True, True, True, False), (True, False, False, False),
        (False, False, False, False), (False, False, True, True)]
    assert [m.explore_on for m in MODES.values()] == [("spot",), ("gpu",), ("gpu",), ("gpu",)]
    assert SPOTLIGHT.needs_spot and not any(m.needs_spot for m in (SYNC, VANILLA, RLBOOST))


def test_an_unknown_mode_names_the_choices():
    assert mode_of("sync") is SYNC and mode_of(SYNC) is SYNC
    with pytest.raises(ValueError, match="mode 'fast' is not one of spotlight, sync, vanilla, "
                                         "rlboost"):
        mode_of("fast")


def test_default_placement_follows_the_mode():
    config = RunConfig()
    assert [config.placed("rollout", m) for m in MODE_NAMES] == [
        ("gpu", "spot"), ("gpu",), ("gpu",), ("gpu", "spot")]
    assert [config.placed("explore", m) for m in MODE_NAMES] == [
        ("spot",), ("gpu",), ("gpu",), ("gpu",)]
    assert config.placed("explore", SPOTLIGHT) == ("spot",)


@pytest.mark.parametrize("mode, trusting, fallback, has_stale, source", [
    ("spotlight", True, "sync", True, "explore"),
    ("spotlight", False, "sync", True, "sync"),
    ("spotlight", False, "random", True, "fallback-random"),
    ("spotlight", True, "sync", False, "random"),     # the first iteration: nothing explored yet
    ("sync", True, "random", False, "sync"),
    ("vanilla", True, "sync", True, "random"),
    ("rlboost", False, "sync", True, "random"),
])
def test_where_seeds_come_from(mode, trusting, fallback, has_stale, source):
    assert seed_source(mode, trusting, fallback, has_stale) == source
