"""The iteration program alone, in milliseconds: which requests it makes, in which order, what
it skips on resume, and which decision each setting leads to. A scripted executor answers its
requests and records stages the way the real executors do (``pipelines.run.recording``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines.run.stages import (
    AuditResult,
    ExploreResult,
    PlanResult,
    RewardResult,
    RolloutResult,
    SelectionResult,
    TrainResult,
)
from spotlight.config import load_config
from spotlight.exploration import Selection
from spotlight.iteration import IterationProgram, TimeModel, drive, requests
from spotlight.iteration.program import selected_seed_tau
from spotlight.models.prompts import Prompt
from tests.pipelines.conftest import TINY_RUN

PROMPTS = [Prompt(f"write {n}", "ocr", target=str(n)) for n in range(6)]
STATS = {"loss": 0.5, "kl_to_reference": 0.0, "clip_fraction": 0.0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("program") / "run.yaml"
    path.write_text(yaml.safe_dump(TINY_RUN))
    return load_config(path)


@dataclass
class Scripted:
    """An executor that records stages as the real ones do and answers with made-up numbers:
    every explored candidate's reward is its seed's last digit / 10."""

    stages: dict = field(default_factory=dict)
    asked: list = field(default_factory=list)
    explored_found: bool = True
    selections: dict = field(default_factory=dict)
    candidates: dict = field(default_factory=dict)

    def done(self, iteration, stage) -> bool:
        return (iteration, str(stage)) in self.stages

    def get(self, iteration, stage) -> Any:
        return self.stages.get((iteration, str(stage)))

    def handle(self, r) -> Any:
        self.asked.append(r)
        kind = type(r).__name__
        if kind == "RecordSelection":
            self.selections[r.iteration] = r.selection
            self.stages[(r.iteration, "selection")] = SelectionResult(r.source)
        elif kind == "ReadSelection":
            return self.selections[r.iteration]
        elif kind == "RecordPlan":
            self.stages[(r.plan.iteration, "plan")] = PlanResult.of(r.plan, r.at)
        elif kind in ("StartExploration", "StartAudit"):
            return r
        elif kind == "FinishExploration":
            start = r.work
            per_prompt = [
                (
                    [int(s) for s in range(100 * p, 100 * p + start.candidates)],
                    [(s % 10) / 10 for s in range(100 * p, 100 * p + start.candidates)],
                )
                for p in range(len(start.prompts))
            ]
            per_prompt += [([], []) for _ in range(len(start.prompts), 2)]
            found = requests.Candidates(per_prompt, [{"start": 0.0, "end": 1.0}])
            self.candidates[(r.iteration, r.stage)] = found
            self.stages[(r.iteration, r.stage)] = ExploreResult(explored=found.explored)
            return found
        elif kind == "ReadCandidates":
            return self.candidates[(r.iteration, r.stage)]
        elif kind == "FinishAudit":
            return [
                Out(p, 0, np.asarray(seeds), np.asarray(seeds, float)[::-1])
                for p, _, seeds in r.work.picks
            ]
        elif kind == "RecordAudit":
            self.stages[(r.iteration, "audit")] = AuditResult(r.audit.kendall_tau)
        elif kind == "RollOutExplored":
            if self.explored_found:
                self.stages[(r.iteration, "rollout")] = RolloutResult(task={"explored": r.stage})
            return self.explored_found
        elif kind == "RollOut":
            self.stages[(r.iteration, "rollout")] = RolloutResult(task={})
        elif kind in ("Score", "ReadRewards"):
            self.stages[(r.iteration, "reward")] = RewardResult(0.5)
            return np.arange(8, dtype=float).reshape(2, 4) / 10
        elif kind == "ComputeAdvantages":
            return {
                "values": r.rewards - 0.3,
                "kept": np.ones(2, bool),
                "group_std": np.full(2, 0.1),
            }
        elif kind == "Train":
            self.stages[(r.iteration, "train")] = TrainResult(STATS)
            return STATS
        elif kind == "Validate":
            return 0.25
        return None

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.asked]


@dataclass
class Out:
    prompt_index: int
    chunk: int
    seeds: np.ndarray
    rewards: np.ndarray


def program(config, mode, executor, **changes):
    config = config.with_values(changes) if changes else config
    return IterationProgram(
        config,
        mode,
        PROMPTS,
        executor,
        TimeModel(window_s=10.0, sec_per_sample_step=0.01, spot_slots=2),
    )


def run(prog, executor, k, validate=False, explore_next=True):
    return drive(prog.iteration(k, validate=validate, explore_next=explore_next), executor.handle)


def test_vanilla_asks_for_random_seeds_a_rollout_a_score_and_a_training_in_that_order(tiny):
    executor = Scripted()
    outcome = run(program(tiny, "vanilla", executor), executor, 0, validate=True)
    assert executor.kinds() == [
        "RecordSelection",
        "StageStarted",
        "RollOut",
        "Score",
        "StageStarted",
        "ComputeAdvantages",
        "Train",
        "Validate",
    ]
    assert executor.asked[0].source == "random" and outcome.val_reward == 0.25
    assert outcome.train_stats == STATS and outcome.resumed == []


def test_a_resumed_iteration_skips_what_the_stage_log_holds(tiny):
    executor = Scripted()
    prog = program(tiny, "vanilla", executor)
    run(prog, executor, 0)
    del executor.stages[(0, "train")]  # the driver died after the reward was recorded
    executor.asked.clear()
    outcome = run(prog, executor, 0)
    assert executor.kinds() == [
        "ReadSelection",
        "StageStarted",
        "ReadRewards",
        "StageStarted",
        "ComputeAdvantages",
        "Train",
    ]
    assert outcome.resumed == ["rollout", "reward"]
    executor.stages[(0, "iteration")] = object()
    assert run(prog, executor, 0) is None  # a whole recorded iteration is only read back


def test_spotlight_selects_among_stale_candidates_audits_and_explores_the_next(tiny):
    executor = Scripted()
    prog = program(tiny, "spotlight", executor, **{"fidelity.audit_every": 1})
    run(prog, executor, 0)  # explores iteration 1 with θ_0 (window: the iteration's start)
    start = next(r for r in executor.asked if isinstance(r, requests.StartExploration))
    assert (start.iteration, start.version, start.stage) == (1, 0, "explore")
    finish = next(r for r in executor.asked if isinstance(r, requests.FinishExploration))
    assert finish.wait_all and finish.planned == 2 * 6  # deadline off: every request
    assert executor.stages[(1, "selection")].source == "explore"
    executor.asked.clear()
    outcome = run(prog, executor, 1)
    kinds = executor.kinds()
    assert kinds[0] == "ReadSelection" and "StartAudit" in kinds and "RecordAudit" in kinds
    assert kinds.index("StartAudit") < kinds.index("RollOut") < kinds.index("FinishAudit")
    # The audit's fresh scores rank the candidates in reverse: τ -1.
    assert outcome.audit_tau == -1.0 and outcome.tau is not None


@pytest.mark.parametrize(
    "fallback, source, explores_now",
    [("random", "fallback-random", False), ("sync", "explore-sync", True)],
)
def test_in_fallback_the_seeds_come_from_the_fallback(tiny, fallback, source, explores_now):
    executor = Scripted()
    prog = program(tiny, "spotlight", executor, **{"fidelity.fallback": fallback})
    run(prog, executor, 0)
    del executor.stages[(1, "selection")]  # selected while trusting: undo for the test
    prog.monitor.state = "fallback"
    executor.asked.clear()
    run(prog, executor, 1, explore_next=False)
    assert executor.stages[(1, "selection")].source == source
    sync = [r for r in executor.asked if isinstance(r, requests.StartExploration)]
    assert [(r.iteration, r.version, r.stage) for r in sync] == (
        [(1, 1, "explore-sync")] if explores_now else []
    )


def test_training_on_explored_samples_rolls_out_only_when_a_sample_is_missing(tiny):
    for found in (True, False):
        executor = Scripted(explored_found=found)
        prog = program(
            tiny,
            "spotlight",
            executor,
            **{"objective.kind": "nft", "objective.train_on_explored": True},
        )
        run(prog, executor, 0)
        executor.asked.clear()
        outcome = run(prog, executor, 1, explore_next=False)
        kinds = executor.kinds()
        assert ("RollOut" in kinds) is not found and "RollOutExplored" in kinds
        assert outcome.explored_rollout is found
        score = next(r for r in executor.asked if isinstance(r, requests.Score))
        assert score.explored is found
        assert (outcome.tau is None) is found  # the same rewards: nothing to rank


def test_with_the_deadline_on_the_next_seeds_take_what_finished_unless_resumed(tiny):
    executor = Scripted()
    prog = program(tiny, "spotlight", executor, **{"exploration.deadline": True})
    run(prog, executor, 0)
    finish = next(r for r in executor.asked if isinstance(r, requests.FinishExploration))
    assert not finish.wait_all


def test_the_planner_plans_on_the_injected_time_and_is_paid(tiny):
    executor = Scripted()
    prog = program(tiny, "spotlight", executor, **{"planner.enabled": True})
    run(prog, executor, 0)
    plan = next(r for r in executor.asked if isinstance(r, requests.RecordPlan))
    assert plan.announce and plan.plan.slots == 2 and plan.plan.reason.startswith("untried")
    assert sum(prog.planner.pulls) == 0
    run(prog, executor, 1)
    assert sum(prog.planner.pulls) == 1  # the plan that explored iteration 1 was paid
    assert prog.planning_state()["planner"]["pulls"] == prog.planner.pulls


def test_the_tau_of_the_selected_seeds_pairs_stale_and_rollout_rewards():
    stale = requests.Candidates([([1, 2, 3], [0.1, 0.2, 0.3]), ([4, 5], [0.5, 0.4])])
    selection = Selection(
        np.array([[1, 2, 3], [4, 5, 9]]), np.zeros(2, int), np.zeros(2, int), np.zeros((2, 3))
    )
    rewards = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 7.0]])
    assert selected_seed_tau(stale, selection, rewards) == 0.0  # +1 and -1, averaged
    assert (
        selected_seed_tau(requests.Candidates([([1], [0.1]), ([], [])]), selection, rewards) is None
    )
