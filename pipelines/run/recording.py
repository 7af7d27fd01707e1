"""How the iteration program's decisions and exploration's results are kept in a run store:
one writer (and reader) of each, shared by both executors, so a run made in process and one
made on a cluster lay out the same files and records.

- ``iter-k/plan``: the plan that explores k (a stage record only);
- ``iter-k/selection/selection.json``: the seeds of k; the record says only their source
  (every record rewrites the whole manifest, so what grows with the run stays out of it);
- ``iter-k/explore[-sync]/candidates.json``: seeds, rewards and task records per prompt;
- ``iter-k/audit/audit.json``: the audited seeds, their stale and fresh scores and τ.
"""

from __future__ import annotations

from typing import Any

from pipelines.run.records import stage_name
from pipelines.run.stage_log import StageLog
from pipelines.run.stages import AuditResult, ExploreResult, PlanResult, SelectionResult, Stage
from spotlight.exploration import Selection, core
from spotlight.exploration.planner import Plan
from spotlight.iteration.requests import Candidates, scored_of
from storage import RunStore


def record_plan(log: StageLog, plan: Plan, at: float) -> None:
    log.record(plan.iteration, Stage.PLAN, PlanResult.of(plan, at))


def record_selection(
    store: RunStore, log: StageLog, iteration: int, selection: Selection, source: str
) -> None:
    store.put_json(stage_name(iteration, "selection"), "selection", selection.to_record())
    log.record(iteration, Stage.SELECTION, SelectionResult(source))


def read_selection(store: RunStore, log: StageLog, iteration: int) -> Selection:
    """The recorded seeds of ``iteration`` (runs recorded before the seeds left the manifest
    keep them in the record)."""
    record = log.get(iteration, Stage.SELECTION)
    return Selection.from_record(
        record.selection or store.get_json(stage_name(iteration, "selection"), "selection")
    )


def read_candidates(store: RunStore, iteration: int, stage: str) -> tuple[Candidates, dict]:
    """The candidates of a recorded exploration stage, and its ``candidates.json`` whole."""
    found = store.get_json(stage_name(iteration, stage), "candidates")
    return candidates_of(found), found


def candidates_of(found: dict) -> Candidates:
    return Candidates(list(zip(found["seeds"], found["rewards"])), found["tasks"])


def store_candidates(
    store: RunStore,
    log: StageLog,
    iteration: int,
    stage: str,
    prompts: int,
    finished: list[Any],
    cancelled: int,
    planned: int,
    dispatch: dict | None,
) -> dict:
    """Gather the finished exploration requests of ``iteration`` (of ``prompts`` prompts)
    into its candidates, store them and record the ``stage``; returns ``candidates.json``."""
    per_prompt = core.gather([scored_of(out) for out in finished], prompts)
    found = {
        "seeds": [s for s, _ in per_prompt],
        "rewards": [r for _, r in per_prompt],
        "tasks": [out.record for out in finished],
        "dispatch": dispatch,
    }
    store.put_json(stage_name(iteration, stage), "candidates", found)
    summary = (dispatch or {}).get("summary", {})
    log.record(
        iteration,
        stage,
        ExploreResult(
            explored=sum(len(s) for s, _ in per_prompt),
            planned=planned,
            requests_finished=len(finished),
            requests_cancelled=cancelled,
            preemptions=summary.get("preemptions_hard", 0) + summary.get("preemptions_graceful", 0),
        ),
    )
    return found


def record_audit(
    store: RunStore, log: StageLog, iteration: int, audit: core.Audit, outs: list[Any]
) -> None:
    store.put_json(
        stage_name(iteration, Stage.AUDIT),
        "audit",
        {
            "seeds": [o.seeds.tolist() for o in outs],
            "prompt_index": [o.prompt_index for o in outs],
            "stale": audit.stale,
            "fresh": audit.fresh,
            "kendall_tau": audit.kendall_tau,
            "tasks": [o.record for o in outs],
        },
    )
    log.record(iteration, Stage.AUDIT, AuditResult(audit.kendall_tau))


def read_rewards(store: RunStore, iteration: int) -> Any:
    """Iteration ``iteration``'s rewards (P, G) as its reward stage stored them."""
    return store.get_arrays(stage_name(iteration, "reward"), "reward")["rewards"]


def read_audit(store: RunStore, iteration: int) -> dict:
    return store.get_json(stage_name(iteration, Stage.AUDIT), "audit")
