"""``make test`` runs every test file once, in one of its two pytest processes (tests/lanes.py)."""
from __future__ import annotations

from tests import lanes


def test_every_test_file_runs_once_in_one_of_the_two_processes():
    beside, main = lanes.lanes()
    every = sorted(p.relative_to(lanes.ROOT).as_posix()
                   for p in (lanes.ROOT / "tests").rglob("test_*.py"))
    assert sorted(beside + main) == every and len(set(beside + main)) == len(every)
    assert beside == list(lanes.BESIDE) and "tests/test_lanes.py" in main
    assert "tests/parallel/test_elastic_chaos.py" in main
