"""What one iteration produces and what its stages hand each other in the driver.

:class:`IterationResult` is the row a user sees in ``session.history`` and what the run store
keeps per iteration; :class:`IterationWork` lives only in the driver while the iteration runs
(everything a crash must not lose is in the run store by then).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from spotlight.iteration import IterationOutcome

if TYPE_CHECKING:
    from distributed import Future


@dataclass
class IterationResult:
    """What one iteration did: the row a user sees in ``session.history``."""

    iteration: int
    mode: str
    reward_mean: float
    group_reward_std: float
    zero_std_groups: int
    loss: float
    kl_to_reference: float
    clip_fraction: float
    val_reward: float | None
    explored: int           # candidates scored for the next iteration
    planned: int            # candidates planned for the next iteration
    filled: int             # seeds of the next iteration filled at random (too few explored)
    start: float
    end: float
    cost_usd: float
    cost_total_usd: float
    resumed_stages: list[str] = field(default_factory=list)
    kendall_tau: float | None = None       # stale exploration vs this rollout, selected seeds
                                           # (biased upwards by the selection; reported only)
    audit_tau: float | None = None         # stale vs fresh scores of random candidates: what
                                           # the fallback decides on
    fidelity_state: str = "trusting"       # or "fallback" (selection of the next iteration)
    plan_candidates: int | None = None     # the planner's N for the next iteration
    plan_steps: int | None = None          # ... and M
    plan_predicted_s: float | None = None
    plan_budget_s: float | None = None
    plan_overrun: bool | None = None       # exploration ran past the training window
    preemptions: int = 0                   # spot requests preempted (hard + graceful)
    approx_kl: float | None = None         # PPO's approximate KL to the rollout policy (None:
    learning_rate: float | None = None     # ... and the step's rate; recorded before they were)
    explore_wait_s: float | None = None    # after its own work, waiting for the next iteration's
                                           # exploration and selecting from it (spot capacity
                                           # short of the plan shows here)

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    def to_record(self) -> dict:
        return asdict(self)


@dataclass
class IterationWork:
    """What the driver holds while an iteration runs: what the program does not decide (task
    records for the timeline, the rollout's future, timings). In memory only: what must
    survive a crash is in the run store."""

    k: int
    start: float
    records: list[dict] = field(default_factory=list)
    rollout_f: Future | None = None      # the rollout, held in its gpu worker's memory
    part_start: float | None = None      # when the unexplored prompts' rollout began
    train_end: float = 0.0
    explore_wait_s: float | None = None
    preemptions: int = 0
    overrun: bool | None = None


def iteration_result(outcome: IterationOutcome, work: IterationWork, mode: str, end: float,
                     cost_usd: float, cost_total_usd: float) -> IterationResult:
    """The row of ``session.history``: what the program decided and the driver measured."""
    adv, info, plan = outcome.advantages, outcome.train_stats, outcome.plan
    return IterationResult(
        iteration=outcome.iteration, mode=mode, reward_mean=float(outcome.rewards.mean()),
        group_reward_std=float(np.mean(adv["group_std"])),
        zero_std_groups=int((~adv["kept"]).sum()), loss=float(info["loss"]),
        kl_to_reference=float(info["kl_to_reference"]),
        clip_fraction=float(info["clip_fraction"]), val_reward=outcome.val_reward,
        explored=outcome.explored, planned=outcome.planned, filled=outcome.filled,
        start=work.start, end=end, cost_usd=cost_usd, cost_total_usd=cost_total_usd,
        resumed_stages=outcome.resumed, kendall_tau=outcome.tau, audit_tau=outcome.audit_tau,
        fidelity_state=outcome.fidelity_state,
        plan_candidates=plan.candidates if plan else None,
        plan_steps=plan.steps if plan else None,
        plan_predicted_s=plan.predicted_s if plan else None,
        plan_budget_s=plan.budget_s if plan else None, plan_overrun=work.overrun,
        preemptions=work.preemptions, approx_kl=_optional(info.get("approx_kl")),
        learning_rate=_optional(info.get("learning_rate")),
        explore_wait_s=work.explore_wait_s)


def _optional(value: Any) -> float | None:
    """A train statistic that a stage recorded by older code may lack."""
    return None if value is None else float(value)
