"""The mutation score counts per module, and keeps uncovered mutants out of the score."""
from __future__ import annotations

import math

from tests.mutation_score import score, table, tally

RESULTS = """\
spotlight/rl/grpo.py:
    spotlight.rl.grpo.x_group_advantages__mutmut_1: killed
    spotlight.rl.grpo.x_group_advantages__mutmut_2: survived
    spotlight.rl.grpo.x_ppo_loss__mutmut_1: timeout
    spotlight.rl.grpo.x_ppo_loss__mutmut_2: no tests
spotlight/exploration/planner.py:
    spotlight.exploration.planner.xǁPlannerǁdecide__mutmut_4: killed
"""


def test_counts_are_per_module_and_a_timeout_counts_as_caught():
    found = tally(RESULTS.splitlines())
    assert set(found) == {"spotlight.rl.grpo", "spotlight.exploration.planner"}
    grpo = found["spotlight.rl.grpo"]
    assert (grpo["killed"], grpo["survived"], grpo["timeout"], grpo["no tests"]) == (1, 1, 1, 1)
    assert score(grpo) == 2 / 3
    assert score(found["spotlight.exploration.planner"]) == 1.0


def test_a_module_with_nothing_judged_has_no_score_and_the_table_totals_all():
    found = tally(["    spotlight.rl.grpo.x_f__mutmut_1: no tests"])
    assert math.isnan(score(found["spotlight.rl.grpo"]))
    lines = table(tally(RESULTS.splitlines())).splitlines()
    assert lines[-1] == "| **all** | 5 | 3 | 1 | 1 | 0 | 75.0% |"
