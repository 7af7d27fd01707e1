"""One RL iteration as a program without I/O: every decision, in order, and nothing else.

Iteration k turns weights θ_k into θ_k+1::

    seeds of k      recorded, or selected among the candidates θ_k-1 scored (stale), or
                    explored now with θ_k (sync, or the fidelity fallback), or random
    audit           every fidelity.audit_every: random stale candidates re-scored with θ_k
    explore k+1     planned (N candidates, M steps) and started with θ_k, from the iteration's
                    start or while θ_k trains (exploration.window)
    rollout         the explored samples themselves (objective.train_on_explored) or sampled
    reward, advantages, τ of the selected seeds, the planner paid for the plan that explored k
    train           θ_k -> θ_k+1, checkpointed
    fidelity        the audit's τ: keep trusting stale rankings, or fall back
    seeds of k+1    what exploration finished (by the deadline) -> selected, if trusted
    validate        θ_k+1, when due

:meth:`IterationProgram.iteration` is a generator: it yields one typed request at a time
(:mod:`spotlight.iteration.requests`) and is sent the executor's answer. It reads what the stage
log says is done and skips it, so a resumed run replays the same decisions. It owns the
exploration planner and the rank-fidelity monitor; its seconds come from an injected
:class:`~spotlight.iteration.timing.PlanningTime`. Two executors run it: the Dask driver
(``pipelines.run.driver``) and the in-process executor (``pipelines.run.inprocess``) -- they
cannot disagree on a decision because neither makes one.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from spotlight.config import RunConfig
from spotlight.exploration import Selection, core
from spotlight.exploration.fidelity import RankFidelityMonitor, audit_due, grouped_kendall_tau
from spotlight.exploration.planner import ExplorationPlanner, Plan
from spotlight.exploration.selection import random_group_std, seed_source
from spotlight.iteration.requests import (
    Candidates,
    ComputeAdvantages,
    EmbedPrompts,
    FidelityChanged,
    FinishAudit,
    FinishExploration,
    ReadCandidates,
    ReadRewards,
    ReadSelection,
    RecordAudit,
    RecordPlan,
    RecordSelection,
    RollOut,
    RollOutExplored,
    Score,
    StageRequest,
    StageStarted,
    StageView,
    StartAudit,
    StartExploration,
    Train,
    Validate,
    scored_of,
)
from spotlight.iteration.timing import PlanningTime
from spotlight.models.base import stores_prompts
from spotlight.models.prompts import Prompt
from spotlight.modes import SPOTLIGHT, Mode, mode_of
from spotlight.rl.trainer import iteration_prompts

Program = Generator[StageRequest, Any, Any]
"""A step of the program: yields requests, is sent their answers, returns its value."""

STALE, SYNC = "explore", "explore-sync"  # the two exploration stages


def pulled(classes: tuple[str, ...]) -> bool:
    """Whether a stage placed on ``classes`` is pulled request by request: with spot workers,
    which come and go, or with several classes."""
    return "spot" in classes or len(classes) > 1


def explore_window(config: RunConfig, mode: str | Mode | None = None) -> str:
    """When stale exploration may run (``iteration`` or ``train``): ``exploration.window``; its
    default ``auto`` is ``train`` when the exploring workers also pull the rollout (they are busy
    with it until then), else ``iteration``."""
    if config.exploration.window != "auto":
        return config.exploration.window
    rollout = config.placed("rollout", mode)
    shared = set(rollout) & set(config.placed("explore", SPOTLIGHT))
    return "train" if pulled(rollout) and shared else "iteration"


def explored_stage(source: str) -> str:
    """Where a selection's candidates were explored: ``explore-sync`` for synchronous
    exploration, else the stale ``explore`` stage (the fallback chooses among its first
    candidates too)."""
    return SYNC if source in ("sync", SYNC) else STALE


def explored_rows(config: RunConfig, selection: Selection | None) -> tuple[int, ...]:
    """The prompts whose samples the iteration with ``selection`` takes from exploration: where
    the config asks for it, those whose every selected seed exploration scored (a plan may
    explore only the first prompts; the others get random seeds and are rolled out)."""
    if not config.objective.train_on_explored or selection is None:
        return ()
    scored = np.isfinite(np.asarray(selection.selected_rewards)).all(axis=1)
    return tuple(int(p) for p in np.flatnonzero(scored))


def selected_seed_tau(stale: Candidates, selection: Selection, rewards: np.ndarray) -> float | None:
    """Kendall τ between the stale exploration rewards (θ_k-1) of the seeds an iteration
    rolled out and their rollout rewards (θ_k), within each prompt; None without pairs.
    Reported only: selection keeps each prompt's extremes, which biases it upwards."""
    xs, ys = [], []
    for p, row in enumerate(selection.seeds):
        scored = dict(zip(stale.per_prompt[p][0], stale.per_prompt[p][1]))
        pairs = [(scored[int(s)], rewards[p, g]) for g, s in enumerate(row) if int(s) in scored]
        if len(pairs) >= 2:
            xs.append([a for a, _ in pairs])
            ys.append([b for _, b in pairs])
    tau = grouped_kendall_tau(xs, ys) if xs else float("nan")
    return None if np.isnan(tau) else float(tau)


@dataclass
class IterationOutcome:
    """What the program decided and learned in one iteration (the executor adds what it
    measured: wall time, cost, preemptions)."""

    iteration: int
    prompts: list[Prompt]
    selection: Selection
    source: str  # where the seeds came from (the selection stage's record)
    resumed: list[str]  # stages recorded before this iteration started
    rewards: np.ndarray | None = None
    advantages: dict | None = None
    train_stats: dict | None = None
    explored_rollout: bool = False  # the rollout was the explored samples
    rolled_out: int = 0  # ... joined with this many samples of the unexplored prompts
    tau: float | None = None  # stale vs rollout rewards of the selected seeds
    audit_tau: float | None = None
    plan: Plan | None = None  # the plan that explores the next iteration
    planned: int = 0  # candidates planned for the next iteration
    explored: int = 0  # ... and scored
    filled: int = 0  # seeds of the next iteration filled at random
    val_reward: float | None = None
    fidelity_state: str = "trusting"


class IterationProgram:
    """The decisions of a run's iterations; its planner and fidelity monitor live here."""

    def __init__(
        self,
        config: RunConfig,
        mode: str | Mode,
        train_prompts: list[Prompt],
        stages: StageView,
        time: PlanningTime,
        planning: dict | None = None,
    ) -> None:
        """``stages``: the run's stage log; ``planning``: the planner and monitor state a
        resumed run restores (:meth:`planning_state`), None for a new run."""
        self.config, self.mode = config, mode_of(mode)
        self.train_prompts, self.stages, self.time = train_prompts, stages, time
        self.planner = ExplorationPlanner(config.planner, config.sampler)
        self.monitor = RankFidelityMonitor(config.fidelity)
        if planning is not None:
            self.planner = ExplorationPlanner.from_dict(
                config.planner, planning["planner"], config.sampler
            )
            self.monitor = RankFidelityMonitor.from_dict(config.fidelity, planning["monitor"])

    @property
    def trusting(self) -> bool:
        """Whether stale rankings are trusted (the fidelity monitor is not in fallback)."""
        return self.monitor.state != "fallback"

    def planning_state(self) -> dict:
        """Planner and monitor, as a resumed run restores them."""
        return {"planner": self.planner.to_dict(), "monitor": self.monitor.to_dict()}

    def prompts(self, iteration: int) -> list[Prompt]:
        """The training prompts of ``iteration`` (epochs over a seeded shuffle)."""
        return iteration_prompts(
            self.train_prompts, iteration, self.config.grpo.prompts_per_iteration, self.config.seed
        )

    # --- one iteration ---------------------------------------------------------------------------
    def iteration(self, k: int, *, validate: bool, explore_next: bool) -> Program:
        """Iteration k: θ_k -> θ_k+1. Returns an :class:`IterationOutcome`, or None when the
        stage log holds the whole iteration already."""
        if self.stages.done(k, "iteration"):
            return None
        explores = explore_next and self.mode.stale
        resumed = [s for s in ("rollout", "reward", "train") if self.stages.done(k, s)]
        selection, source = yield from self.seeds_for(k)
        out = IterationOutcome(k, self.prompts(k), selection, source, resumed)
        if stores_prompts(self.config):
            following = self.prompts(k + 1) if explores else []
            yield EmbedPrompts(k, [p.text for p in out.prompts + following])
        # The spot workers are idle while the rollout runs: audit the stale ranking then, and
        # (window "iteration") start exploring k+1 with θ_k, which is ready before the rollout.
        audit = yield from self._start_audit(k)
        early = explores and explore_window(self.config, self.mode) == "iteration"
        exploring = (yield from self._start_next(k, out)) if early else None
        yield StageStarted(k, "rollout")
        yield from self._rollout_and_reward(out)
        yield StageStarted(k, "train")
        out.advantages = yield ComputeAdvantages(k, out.rewards)
        if self.mode.stale:
            if not out.explored_rollout:  # trained on explored: the same rewards, no ranking
                out.tau = yield from self._selected_seed_tau(k, selection, out.rewards)
            yield from self._pay_planner(k, out.advantages)
        if explores and not early:
            exploring = yield from self._start_next(k, out)
        recorded = self.stages.get(k, "train")
        out.train_stats = (
            recorded.stats
            if recorded is not None
            else (yield Train(k, out.prompts, out.rewards, out.advantages))
        )
        out.audit_tau = yield from self._watch_fidelity(k, audit)
        yield from self._seeds_of_next(out, exploring)
        out.val_reward = (yield Validate(k + 1)) if validate else None
        out.fidelity_state = self.monitor.state
        return out

    # --- seeds -----------------------------------------------------------------------------------
    def seeds_for(self, k: int) -> Program:
        """(selection, source) of iteration k: recorded, explored synchronously now, selected
        among the stale candidates (or their first G, in fallback), or random."""
        recorded = self.stages.get(k, "selection")
        if recorded is not None:
            return (yield ReadSelection(k)), recorded.source
        explored = self.mode.stale and self.stages.done(k, STALE)
        source = seed_source(self.mode.name, self.trusting, self.config.fidelity.fallback, explored)
        if source == "sync":
            return (yield from self._explore_now(k)), SYNC
        stale = (yield ReadCandidates(k, STALE)) if explored else None
        selection = self._selection(k, source, stale.per_prompt if stale else None)
        yield RecordSelection(k, selection, source)
        return selection, source

    def _selection(self, k: int, source: str, per_prompt: core.PerPrompt | None) -> Selection:
        cfg = self.config
        return core.selection_of(
            "sync" if source == SYNC else source,
            cfg.seed,
            k,
            cfg.grpo.prompts_per_iteration,
            cfg.grpo.group_size,
            per_prompt,
            cfg.exploration.selection,
        )

    def _explore_now(self, k: int) -> Program:
        """Synchronous exploration with θ_k on gpu workers (sync mode, or the fallback)."""
        yield StageStarted(k, SYNC)
        candidates, prompts = self.config.exploration.candidates, self.prompts(k)
        work = yield StartExploration(k, k, SYNC, prompts, candidates, None)
        found = yield FinishExploration(k, SYNC, work, len(prompts) * candidates, wait_all=True)
        selection = self._selection(k, SYNC, found.per_prompt)
        yield RecordSelection(k, selection, SYNC)
        return selection

    def _seeds_of_next(self, out: IterationOutcome, exploring: Any) -> Program:
        """What exploration of k+1 finished -> the seeds of k+1 (recorded while trusted)."""
        if exploring is None:
            return
        k, plan = out.iteration, out.plan
        # No training window to hide in after a resume; deadline off = every request.
        wait_all = not self.config.exploration.deadline or "train" in out.resumed
        yield StageStarted(k, "select")
        out.planned = plan.prompts * plan.candidates
        found = yield FinishExploration(k + 1, STALE, exploring, out.planned, wait_all)
        out.explored = found.explored
        if self.trusting:
            selection = self._selection(k + 1, STALE, found.per_prompt)
            yield RecordSelection(k + 1, selection, STALE)
            out.filled = int(selection.filled.sum())

    # --- exploring the next iteration ------------------------------------------------------------
    def _start_next(self, k: int, out: IterationOutcome) -> Program:
        """Plan the exploration of k+1 (``out.plan``) and start it with θ_k: a handle, or None
        when there is nothing to explore (recorded already, or a plan of none)."""
        plan = out.plan = yield from self.plan(k + 1)
        if self.stages.done(k + 1, STALE) or not plan.candidates:
            return None
        prompts = self.prompts(k + 1)[: plan.prompts]
        return (yield StartExploration(k + 1, k, STALE, prompts, plan.candidates, plan.steps))

    def plan(self, iteration: int) -> Program:
        """The (N, M) that explores ``iteration``: recorded, or the planner's (fixed with the
        planner off), recorded now."""
        recorded = self.stages.get(iteration, "plan")
        if recorded is not None:
            return recorded.as_plan
        cfg = self.config
        rollout_steps = cfg.exploration.steps or cfg.sampler.num_steps
        prompts = cfg.grpo.prompts_per_iteration
        if cfg.planner.enabled:
            given = self.time.planning_inputs(iteration)
            replaced = given.replaced_rollout_s if cfg.objective.train_on_explored else None
            plan = self.planner.plan(
                iteration,
                prompts,
                cfg.grpo.group_size,
                given.spot_slots,
                given.windows_s,
                given.sec_per_sample_step,
                rollout_steps,
                replaced,
            )
        else:
            plan = Plan(
                iteration,
                cfg.exploration.candidates,
                rollout_steps,
                prompts,
                None,
                None,
                None,
                "fixed: planner off",
            )
            self.planner.events.append({"kind": "plan", **asdict(plan)})
        yield RecordPlan(plan, self.time.now(), announce=cfg.planner.enabled)
        return plan

    def _pay_planner(self, k: int, advantages: dict) -> Program:
        """Pay the planner for the plan that explored iteration k: the spread GRPO saw, per
        second of the exploration and of the window billed for it."""
        recorded = self.stages.get(k, "plan")
        if recorded is None or not self.stages.done(k, STALE):
            return
        stale = yield ReadCandidates(k, STALE)
        if not stale.tasks:
            return
        plan = recorded.as_plan
        random_std = random_group_std(
            [rewards for _, rewards in stale.per_prompt], self.config.grpo.group_size
        )
        actual_s, billed_s = self.time.plan_outcome(k, plan, stale.tasks)
        self.planner.record(
            plan, actual_s, float(np.mean(advantages["group_std"])), random_std, billed_s
        )

    # --- the rollout -----------------------------------------------------------------------------
    def _rollout_and_reward(self, out: IterationOutcome) -> Program:
        """The rollout (the explored samples, where they may be trained on) and its rewards,
        skipping what is recorded."""
        k, prompts, selection = out.iteration, out.prompts, out.selection
        if not self.stages.done(k, "rollout"):
            rows = explored_rows(self.config, selection)
            others = tuple(p for p in range(len(prompts)) if p not in rows)
            if rows and others:  # partial reuse: sample only what exploration did not
                yield RollOut(k, prompts, selection.seeds, rows=others)
            found = bool(rows) and (
                yield RollOutExplored(k, prompts, selection, explored_stage(out.source), rows)
            )
            if not found:
                yield RollOut(k, prompts, selection.seeds)
        task = self.stages.get(k, "rollout").task or {}
        out.explored_rollout = bool(task.get("explored"))
        out.rolled_out = int(task.get("rolled_out", 0))
        if self.stages.done(k, "reward"):
            out.rewards = yield ReadRewards(k)
        else:  # explored samples come with their rewards; joined ones are scored together
            out.rewards = yield Score(k, prompts, out.explored_rollout and not out.rolled_out)

    def _selected_seed_tau(self, k: int, selection: Selection, rewards: np.ndarray) -> Program:
        if not self.stages.done(k, STALE):
            return None
        return selected_seed_tau((yield ReadCandidates(k, STALE)), selection, rewards)

    # --- rank fidelity ---------------------------------------------------------------------------
    def _start_audit(self, k: int) -> Program:
        """Re-score a random subset of k's stale candidates with θ_k, at the steps the stale
        exploration took (it measures staleness and nothing else): a handle, or None."""
        fidelity = self.config.fidelity
        if not self.mode.stale or self.stages.done(k, "audit"):
            return None
        if not self.stages.done(k, STALE) or not audit_due(k, fidelity.audit_every):
            return None
        stale = yield ReadCandidates(k, STALE)
        picks = core.audit_candidates(
            self.config.seed, k, stale.per_prompt, fidelity.audit_prompts, fidelity.audit_candidates
        )
        if not picks:
            return None
        plan = self.stages.get(k, "plan")
        prompts = self.prompts(k)
        return (
            yield StartAudit(
                k,
                [(p, prompts[p], seeds) for p, seeds in picks],
                core.audit_steps(plan.as_plan if plan is not None else None),
            )
        )

    def _watch_fidelity(self, k: int, audit: Any) -> Program:
        """The audit's τ (random candidates, stale vs fresh) decides whether the next iteration
        may use the stale ranking: it is the unbiased sample of it."""
        audit_tau = None
        if audit is not None:
            outs = yield FinishAudit(k, audit)
            if outs:
                stale = yield ReadCandidates(k, STALE)
                judged = core.audit_tau(stale.per_prompt, [scored_of(out) for out in outs])
                yield RecordAudit(k, judged, outs)
                audit_tau = judged.kendall_tau
        elif (recorded := self.stages.get(k, "audit")) is not None:
            audit_tau = recorded.kendall_tau
        if self.mode.stale and audit_tau is not None:
            decision = self.monitor.observe(k, audit_tau)
            if decision.changed:
                yield FidelityChanged(decision)
        return audit_tau


def validation_due(config: RunConfig, k: int, iterations: int) -> bool:
    """Whether θ_k+1 is validated in a run of ``iterations``: every ``validation.every`` and
    after the last."""
    return (k + 1) % config.validation.every == 0 or k + 1 == iterations
