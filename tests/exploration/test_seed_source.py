"""Where an iteration's seeds come from: the one rule the pipeline and the harness share."""
from __future__ import annotations

import pytest

from spotlight.exploration.selection import seed_source


@pytest.mark.parametrize("mode,trusting,fallback,has_stale,source", [
    ("vanilla", True, "random", False, "random"),
    ("sync", True, "random", False, "sync"),
    ("spotlight", True, "random", True, "explore"),
    ("spotlight", True, "random", False, "random"),          # the first iteration: none explored
    ("spotlight", False, "random", True, "fallback-random"),  # stale scores kept for τ only
    ("spotlight", False, "random", False, "random"),
    ("spotlight", False, "sync", True, "sync"),               # distrusted: explore fresh instead
    ("spotlight", False, "sync", False, "sync"),
    ("rlboost", True, "sync", False, "random"),
])
def test_seed_source(mode, trusting, fallback, has_stale, source):
    assert seed_source(mode, trusting, fallback, has_stale) == source
