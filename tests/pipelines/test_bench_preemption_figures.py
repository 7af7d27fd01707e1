"""The preemption benchmark's figures, from hand-written injector and dispatcher logs."""
from __future__ import annotations

import pytest

from pipelines.bench.preemption import _outage_s, _step_seconds, preemption_figures

STAGE = "iter-1/explore"


def _chaos(log: list[dict], injector: list[dict], records: list[dict], max_pre: int = 1) -> dict:
    return {"injector": injector, "records": records,
            "dispatch": [{"stage": STAGE, "log": log,
                          "summary": {"max_preemptions_of_one_request": max_pre}}]}


def test_hard_kill_loses_the_time_since_the_last_commit_in_steps():
    log = [{"kind": "assigned", "at": 10.0, "request": "a"},
           {"kind": "requeued", "at": 12.2, "request": "a", "worker": "spot-0", "step": 3,
            "committed_at": 11.5, "hard": True}]
    injector = [{"kind": "kill", "worker": "spot-0", "at": 12.0}]
    records = [{"stage": "explore", "iteration": 1, "request": "a", "first_step_at": 14.0}]
    out = preemption_figures(_chaos(log, injector, records), step_s=0.25)
    assert out["lost_steps_per_preemption"]["hard_each"] == [pytest.approx(2.0)]
    assert out["recovery_s"]["p50"] == pytest.approx(2.0)   # kill at 12 -> first step at 14


def test_a_resumed_attempt_counts_from_its_own_assignment_not_the_old_commit():
    log = [{"kind": "assigned", "at": 20.0, "request": "a"},
           {"kind": "requeued", "at": 21.0, "request": "a", "worker": "spot-1", "step": 3,
            "committed_at": 11.5, "hard": True}]
    injector = [{"kind": "kill", "worker": "spot-1", "at": 20.5}]
    out = preemption_figures(_chaos(log, injector, []), step_s=0.5)
    assert out["lost_steps_per_preemption"]["hard"] == pytest.approx(1.0)
    assert out["recovery_s"]["n"] == 0   # no finished attempt recorded: no recovery figure


def test_a_kill_before_the_stream_opened_loses_nothing_and_notices_lose_the_uncommitted():
    log = [{"kind": "assigned", "at": 1.0, "request": "a"},
           {"kind": "requeued", "at": 9.0, "request": "a", "worker": "spot-2", "step": 0,
            "committed_at": None, "hard": True},
           {"kind": "handed_back", "at": 9.5, "request": "b", "worker": "spot-3", "step": 4,
            "computed_step": 4},
           {"kind": "handed_back", "at": 9.6, "request": "c", "worker": "spot-3", "step": 4,
            "computed_step": 5}]
    injector = [{"kind": "kill", "worker": "spot-2", "at": 8.0}]
    out = preemption_figures(_chaos(log, injector, []), step_s=0.1)
    assert out["lost_steps_per_preemption"]["hard_each"] == [0.0]
    assert out["lost_steps_per_preemption"]["graceful_each"] == [0, 1]
    assert out["lost_steps_per_preemption"]["graceful"] == pytest.approx(0.5)


def test_outage_runs_from_starvation_to_the_next_assignment():
    log = [{"kind": "starved", "at": 5.0}, {"kind": "starved", "at": 6.0},
           {"kind": "assigned", "at": 9.0}, {"kind": "assigned", "at": 10.0},
           {"kind": "starved", "at": 20.0}, {"kind": "assigned", "at": 21.5}]
    assert _outage_s(log) == pytest.approx(5.5)


def test_step_seconds_leave_out_loading_and_scoring():
    records = [{"stage": "explore", "steps": 10, "first_step": 1, "first_step_at": 100.0,
                "last_step_at": 100.9, "start": 90.0, "end": 130.0},
               {"stage": "rollout", "steps": 10, "first_step": 1, "first_step_at": 0.0,
                "last_step_at": 90.0}]
    assert _step_seconds(records) == pytest.approx(0.1)


def test_the_chosen_scenarios_run_in_the_bench_order_and_unknown_ones_are_named():
    from pipelines.bench.preemption import chosen_scenarios

    assert chosen_scenarios(None, quick=False) == ("main", "balance", "sp")
    assert chosen_scenarios(None, quick=True) == ("main",)
    assert chosen_scenarios(["sp", "main"], quick=False) == ("main", "sp")
    assert chosen_scenarios(["sp"], quick=True) == ("sp",)
    with pytest.raises(ValueError, match=r"--scenarios sp,chaos: unknown chaos; expected some "
                                         r"of main, balance, sp"):
        chosen_scenarios(["sp", "chaos"], quick=False)
