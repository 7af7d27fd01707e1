"""Where the iteration program's seconds come from: the planner plans exploration into a time
window and is paid by the spread it bought per second. On a cluster those seconds are measured
(the stage log's task records); in process there is no clock worth the name, and a
:class:`TimeModel` -- seconds measured once on a cluster -- stands in. The program sees either
through :class:`PlanningTime`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from spotlight.exploration.planner import Plan, plan_cost


@dataclass(frozen=True)
class PlanningInputs:
    """What the planner plans the exploration of one iteration with."""

    spot_slots: int  # spot workers x threads that can explore
    windows_s: list[float]  # exploration windows of recent iterations
    sec_per_sample_step: float | None  # one slot's seconds per candidate and step
    replaced_rollout_s: float | None  # a rollout exploring every prompt saves (or None)


class PlanningTime(Protocol):
    """The program's clock and the seconds its planner plans and is paid with."""

    def now(self) -> float:
        """Seconds since the epoch (when a plan was made)."""

    def planning_inputs(self, iteration: int) -> PlanningInputs:
        """What the planner knows when it plans the exploration of ``iteration``."""

    def plan_outcome(
        self, iteration: int, plan: Plan, tasks: list[dict]
    ) -> tuple[float, float | None]:
        """(spot seconds the exploration of ``iteration`` took, seconds billed for its window
        or None) -- ``tasks``: the records of its finished requests."""


@dataclass(frozen=True)
class TimeModel:
    """Modelled seconds, for a run without a clock of its own (the in-process executor)."""

    window_s: float  # exploration window of one iteration (measured on a cluster)
    sec_per_sample_step: float  # one spot slot's seconds per candidate and denoising step
    spot_slots: int = 1  # spot workers x threads: the spot capacity rented
    rollout_s: float | None = None  # a rollout's seconds, which exploring every prompt saves
    # under objective.train_on_explored (None: not measured)

    def explore_s(self, plan: Plan) -> float:
        """Wall seconds the plan's exploration takes on the spot slots."""
        return (
            plan_cost(plan.prompts, plan.candidates, plan.steps, self.sec_per_sample_step)
            / self.spot_slots
        )

    def now(self) -> float:
        return time.time()

    def planning_inputs(self, iteration: int) -> PlanningInputs:
        return PlanningInputs(
            self.spot_slots, [self.window_s], self.sec_per_sample_step, self.rollout_s
        )

    def plan_outcome(
        self, iteration: int, plan: Plan, tasks: list[dict]
    ) -> tuple[float, float | None]:
        return self.explore_s(plan), self.window_s * self.spot_slots


class NoPlanningTime:
    """For a run whose planner is off: plans are fixed, nothing is timed."""

    def now(self) -> float:
        return time.time()

    def planning_inputs(self, iteration: int) -> PlanningInputs:
        raise RuntimeError("the planner is off: nothing plans with modelled time")

    def plan_outcome(
        self, iteration: int, plan: Plan, tasks: list[dict]
    ) -> tuple[float, float | None]:
        return sum(t["end"] - t["start"] for t in tasks), None
