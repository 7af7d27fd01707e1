"""The compared systems, each an iteration written out over the simulated cluster.

- ``ondemand``: vanilla Flow-GRPO on on-demand GPUs: rollout, then training.
- ``sync``: exploration of ``workload.candidates`` seeds per prompt with the current weights on
  the on-demand GPUs before the rollout (on the critical path).
- ``offpolicy``: LLM-style one-step off-policy pipelining: the on-demand GPUs split into a
  rollout pool and a training pool, and iteration k+1's rollout runs while iteration k trains.
- ``rlboost``: rollouts pulled by on-demand and spot GPUs with adaptive offload, weights pushed
  to the spot GPUs after training and pulled from a peer by newcomers, preempted work migrated
  after a notice (lost on a hard kill); no exploration, so the spot GPUs idle while training.
- ``spotlight``: RLBoost's rollout plus per-step commits (a hard kill loses no step), stale
  exploration on the spot GPUs inside the training window sized by the real planner, and
  elastic SP groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotlight.config import PlannerConfig
from spotlight.cost import CostLedger
from spotlight.exploration.planner import ExplorationPlanner
from spotlight.scheduling.traces import SpotTrace
from spotlight.sim.clock import Clock
from spotlight.sim.config import SimConfig
from spotlight.sim.fleet import Fleet
from spotlight.sim.model import (
    exploration_quality,
    iteration_progress,
    pipelined_split,
    request_seconds,
    spread_ratio,
    train_seconds,
)
from spotlight.sim.stage import RequestStage, StageStats, Work

SPOT_SYSTEMS = ("rlboost", "spotlight")


@dataclass
class IterationRecord:
    iteration: int
    start: float
    end: float = 0.0
    rollout_s: float = 0.0
    explore_s: float = 0.0        # exploration on the critical path (sync)
    train_s: float = 0.0
    quality: float = 0.0          # the exploration behind this iteration's seeds (0..1)
    progress: float = 1.0         # to the target, in on-demand iterations
    finish_spread_s: float = 0.0  # first to last GPU group finishing its rollout work
    tail_idle_share: float = 0.0  # rollout GPU-time spent waiting for the last request
    spot_billed_train_s: float = 0.0
    spot_busy_train_s: float = 0.0
    hard_preemptions: int = 0
    graceful_preemptions: int = 0
    plan: dict | None = None      # spotlight: the planner's N, M and prompts for the next one

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class SystemResult:
    system: str
    iterations: list[IterationRecord]
    iterations_to_target: int | None
    end_s: float
    cost_usd: dict[str, float]
    gpu_hours: dict[str, float]
    preemptions: int
    spans: list[tuple[str, float, float, str]] = field(default_factory=list)


class SystemRun:
    """One system on one simulated cluster, iteration by iteration, until the target."""

    def __init__(self, config: SimConfig, system: str, trace: SpotTrace | None,
                 prices: dict[str, float], timeline_iteration: int | None = None) -> None:
        self.config, self.system = config, system
        self.w, self.t = config.workload, config.timing
        self.clock = Clock(horizon_s=1e10)
        self.ledger = CostLedger(prices)
        self.fleet = Fleet(self.clock, config, spot=system in SPOT_SYSTEMS,
                           elastic=system == "spotlight", ledger=self.ledger, trace=trace)
        self.timeline_iteration = timeline_iteration
        self.spans: list[tuple[str, float, float, str]] = []
        self.next_quality = 0.0
        self.train_history: list[float] = []
        self.sec_per_sample_step: float | None = None
        p = config.planner
        self.planner = ExplorationPlanner(PlannerConfig(
            candidates=list(p.candidates), steps=list(p.steps), gamma=p.gamma,
            budget_fraction=p.budget_fraction, payoff="billed"))
        od_units = sorted(u.name for u in self.fleet.ready_units("gpu"))
        self.rollout_pool, self.train_gpus = od_units, config.cluster.ondemand_gpus
        if system == "offpolicy" and len(od_units) > 1:
            per_request = request_seconds(self.t, self.w.rollout_request_images,
                                          self.w.rollout_steps)
            work_s = math.ceil(self.w.images / self.w.rollout_request_images) * per_request
            rollout_gpus = pipelined_split(self.t, config.cluster.ondemand_gpus, self.w.images,
                                           work_s * self.t.sp_degree)
            self.rollout_pool = od_units[:rollout_gpus // self.t.sp_degree]
            self.train_gpus = config.cluster.ondemand_gpus - rollout_gpus

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> SystemResult:
        needed = float(self.config.convergence.ondemand_iterations)
        ratio = self.config.convergence.ratio(self.system)
        records: list[IterationRecord] = []
        total, reached = 0.0, None
        for k in range(self.config.max_iterations):
            record = getattr(self, f"_iteration_{self.system}")(k)
            record.progress = iteration_progress(ratio, record.quality)
            records.append(record)
            total += record.progress
            if total >= needed - 1e-9:
                reached = k + 1
                break
        end = self.clock.now
        cost = self.ledger.total(end)
        seconds = self.ledger.gpu_seconds(0.0, end)
        return SystemResult(self.system, records, reached, end, cost,
                            {"ondemand": seconds["gpu"] / 3600, "spot": seconds["spot"] / 3600},
                            self.fleet.preemptions, self.spans)

    # -- building blocks -------------------------------------------------------------------
    def _keep(self, k: int) -> bool:
        return self.timeline_iteration == k

    def _rollout_work(self) -> list[Work]:
        size, images = self.w.rollout_request_images, self.w.images
        return [Work(f"r{i}", min(size, images - i * size), self.w.rollout_steps)
                for i in range(math.ceil(images / size))]

    def _explore_work(self, prompts: int, candidates: int, steps: int) -> list[Work]:
        size = self.w.explore_request_images
        return [Work(f"p{p}-c{c}", min(size, candidates - c * size), steps, group=f"p{p}")
                for p in range(prompts) for c in range(math.ceil(candidates / size))]

    def _stage(self, k: int, work: list[Work], name: str, **options) -> StageStats:
        stage = RequestStage(self.clock, self.fleet, self.t, work, keep_spans=self._keep(k),
                             name=name, **options)
        stats = stage.run()
        self.spans += stats.spans
        return stats

    def _driver(self) -> None:
        """The driver's seconds at a boundary of the critical path (every GPU waits)."""
        self.clock.advance_to(self.clock.now + self.t.driver_s_per_stage)

    def _rollout(self, k: int, record: IterationRecord, **options) -> StageStats:
        self._driver()
        start = self.clock.now
        stats = self._stage(k, self._rollout_work(), "rollout",
                            reward_s_per_image=self.w.reward_s_per_image, **options)
        record.rollout_s = self.clock.now - start
        ends = list(stats.unit_last_end.values())
        if ends and record.rollout_s > 0:
            record.finish_spread_s = max(ends) - min(ends)
            record.tail_idle_share = sum(self.clock.now - e for e in ends) / (
                len(ends) * record.rollout_s)
        record.hard_preemptions += stats.hard_preemptions
        record.graceful_preemptions += stats.graceful_preemptions
        return stats

    def _train_until(self, k: int, start: float, seconds: float, lanes: list[str]) -> None:
        self.clock.advance_to(start + seconds)
        if self._keep(k):
            self.spans += [(lane, start, start + seconds, "train") for lane in lanes]

    def _spot_rollout(self, k: int, record: IterationRecord, commit: bool) -> None:
        # Spot GPUs pull once they hold the new weights (broadcast after training).
        self._rollout(k, record, classes=("gpu", "spot"), offload=True, commit_steps=commit,
                      join_after={"spot": self.t.weight_sync_s})

    # -- the systems -----------------------------------------------------------------------
    def _iteration_ondemand(self, k: int) -> IterationRecord:
        record = IterationRecord(k, self.clock.now)
        self._rollout(k, record, classes=("gpu",), commit_steps=False)
        self._train(k, record)
        return record

    def _iteration_sync(self, k: int) -> IterationRecord:
        record = IterationRecord(k, self.clock.now, quality=1.0)
        self._driver()
        start = self.clock.now
        self._stage(k, self._explore_work(self.w.prompts_per_iteration, self.w.candidates,
                                          self.w.rollout_steps),
                    "explore", classes=("gpu",), commit_steps=False)
        record.explore_s = self.clock.now - start
        self._rollout(k, record, classes=("gpu",), commit_steps=False)
        self._train(k, record)
        return record

    def _iteration_offpolicy(self, k: int) -> IterationRecord:
        record = IterationRecord(k, self.clock.now)
        if k == 0:   # nothing to train on before the first rollout
            self._rollout(k, record, classes=("gpu",), units=self.rollout_pool,
                          commit_steps=False)
        start = self.clock.now
        seconds = train_seconds(self.t, self.w.images, self.train_gpus)
        self._rollout(k, record, classes=("gpu",), units=self.rollout_pool, commit_steps=False)
        train_lanes = [u for u in sorted(self.fleet.units) if u.startswith("od")
                       and u not in self.rollout_pool]
        self._train_until(k, start, max(seconds, self.clock.now - start), [])
        if self._keep(k):
            self.spans += [(lane, start, start + seconds, "train") for lane in train_lanes]
        record.train_s = seconds
        self.clock.advance_to(self.clock.now + self.t.weight_sync_s)   # to the rollout pool
        self._driver()
        record.end = self.clock.now
        return record

    def _iteration_rlboost(self, k: int) -> IterationRecord:
        record = IterationRecord(k, self.clock.now)
        self._spot_rollout(k, record, commit=False)
        self._train(k, record)
        return record

    def _iteration_spotlight(self, k: int) -> IterationRecord:
        record = IterationRecord(k, self.clock.now, quality=self.next_quality)
        self._spot_rollout(k, record, commit=True)
        self.next_quality = self._train(k, record, explore=True)
        return record

    def _train(self, k: int, record: IterationRecord, explore: bool = False) -> float:
        """Training on the on-demand GPUs; with ``explore``, stale exploration for the next
        iteration on the spot GPUs until training ends. Returns that exploration's quality."""
        self._driver()
        start = self.clock.now
        seconds = train_seconds(self.t, self.w.images, self.config.cluster.ondemand_gpus)
        billed0 = self.fleet.spot_gpu_seconds()
        quality = self._explore_stale(k, start + seconds, record) if explore else 0.0
        self._train_until(k, start, seconds, sorted(u for u in self.fleet.units
                                                    if u.startswith("od")))
        record.train_s = seconds
        record.spot_billed_train_s = self.fleet.spot_gpu_seconds() - billed0
        self._driver()
        record.end = self.clock.now
        self.train_history.append(seconds)
        return quality

    def _explore_stale(self, k: int, deadline: float, record: IterationRecord) -> float:
        """Explore iteration k+1's prompts with θ_k on the spot GPUs until ``deadline``."""
        w = self.w
        slots = len(self.fleet.ready_units("spot"))
        plan = self.planner.plan(k + 1, w.prompts_per_iteration, w.group_size, slots,
                                 self.train_history, self.sec_per_sample_step, w.rollout_steps)
        if plan.candidates <= 0 or plan.prompts <= 0:
            return 0.0
        work = self._explore_work(plan.prompts, plan.candidates, plan.steps)
        stats = self._stage(k, work, "explore", classes=("spot",), commit_steps=True,
                            deadline=deadline)
        done = set(stats.done)
        unfinished = {x.group for x in work if x.name not in done}
        explored = sum(1 for p in range(plan.prompts) if f"p{p}" not in unfinished)
        if stats.done_sample_steps:
            self.sec_per_sample_step = stats.done_unit_s / stats.done_sample_steps
        gain = spread_ratio(plan.candidates, w.group_size,
                            self.config.convergence.spread_per_log_candidates)
        share = explored / w.prompts_per_iteration
        busy = stats.busy_s.get("spot", 0.0)
        self.planner.record(plan, busy / self.t.sp_degree, 1.0 + (gain - 1.0) * share, 1.0,
                            billed_s=(deadline - stats.start) * max(slots, 1))
        record.spot_busy_train_s = busy
        record.plan = {"candidates": plan.candidates, "steps": plan.steps,
                       "prompts": plan.prompts, "explored": explored, "slots": slots}
        return exploration_quality(explored, w.prompts_per_iteration, plan.candidates,
                                   w.group_size, w.candidates)
