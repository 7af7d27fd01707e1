"""The Dask iteration without Dask: the same task functions, called in order in this process.

A run of :class:`Harness` computes exactly what :class:`~pipelines.run.driver.Driver` computes
on a cluster -- the same seeds, exploration with θ_k-1 for iteration k, selection, audit and
fidelity fallback, rollout, reward, advantages, training -- bit for bit (tested against the
pinned cluster runs), because it calls the very task functions the workers run, with the
workers' torch thread count, on an in-memory run store. What it leaves out is what does not
change the numbers: Dask, the manifest, streamed latents, events, the cost ledger, timing. So
iteration efficiency (iterations to a target) is measured here, many seeds in one sitting, and
time per iteration on the cluster.

Exploration runs every planned request (``exploration.deadline`` off: the deadline depends on
measured time). The planner runs on modelled time (:class:`TimeModel`: the exploration window and
the spot workers' seconds per sample-step, measured on a cluster, and how many spot slots there
are), so its choices -- and what a spot capacity 2 or 4 times the gpu workers' buys -- can be
measured over many seeds too; with ``planner.enabled`` off every iteration explores
``exploration.candidates`` at the rollout's steps.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipelines.cluster.runtime import reset_runtime
from pipelines.run import tasks
from pipelines.run.exploration import explore_requests, scored
from pipelines.run.explored import explored_rollout_task, trains_on_explored
from pipelines.run.rollout import rollout_task
from spotlight.config import ConfigError, RunConfig
from spotlight.exploration import Selection, core
from spotlight.exploration.selection import random_group_std, seed_source
from spotlight.exploration.fidelity import (RankFidelityMonitor, audit_due,
                                            grouped_kendall_tau)
from spotlight.exploration.planner import ExplorationPlanner, Plan, plan_cost
from spotlight.models.base import base_policy
from spotlight.models.prompts import Prompt, world_prompts
from spotlight.rl.trainer import iteration_prompts
from spotlight.modes import MODE_NAMES, MODES
from storage import RunStore
from storage.attempts import Attempt


@dataclass(frozen=True)
class TimeModel:
    """The seconds the planner plans with in the harness, which has no clock of its own."""

    window_s: float              # exploration window of one iteration (measured on a cluster)
    sec_per_sample_step: float   # one spot slot's seconds per candidate and denoising step
    spot_slots: int = 1          # spot workers x threads: the spot capacity rented
    rollout_s: float | None = None   # a rollout's seconds, which exploring every prompt saves
                                     # under objective.train_on_explored (None: not measured)

    def explore_s(self, plan: Plan) -> float:
        """Wall seconds the plan's exploration takes on the spot slots."""
        return plan_cost(plan.prompts, plan.candidates, plan.steps,
                         self.sec_per_sample_step) / self.spot_slots


@dataclass
class HarnessIteration:
    """What one iteration measured."""

    iteration: int
    rollout_reward: float
    group_std: float                 # mean within-prompt std of the rollout rewards
    source: str                      # where the seeds came from: random, explore, sync, ...
    audit_tau: float | None = None   # stale vs fresh ranking of random candidates
    val_reward: float | None = None  # of θ_k+1, when validated
    plan: tuple[int, int, int] | None = None   # the planner's N, M and prompts for k+1
    trained_on_explored: bool = False   # its rollout was the explored samples (no sampling)


@dataclass
class HarnessRun:
    mode: str
    seed: int
    base_val_reward: float
    iterations: list[HarnessIteration] = field(default_factory=list)

    def val_curve(self) -> list[tuple[int, float]]:
        """(iterations trained, validation reward), from the base model on."""
        return [(0, self.base_val_reward)] + [(it.iteration + 1, it.val_reward)
                                              for it in self.iterations
                                              if it.val_reward is not None]


class Harness:
    """One run of ``mode`` from the cached base model, iteration by iteration."""

    def __init__(self, config: RunConfig, mode: str, base_val_reward: float | None = None,
                 time_model: TimeModel | None = None) -> None:
        """``base_val_reward``: the base model's validation reward when the caller measured it
        already (it depends on neither the mode nor the run seed), saving one validation.
        ``time_model``: what the planner plans with (needed with ``planner.enabled``)."""
        if mode not in MODES:
            raise ConfigError(f"harness mode {mode!r}: choose one of {', '.join(MODE_NAMES)}")
        stale = MODES[mode].stale
        if config.exploration.deadline:
            raise ConfigError("the harness replays exploration without a clock: set "
                              "exploration.deadline: false")
        if config.planner.enabled and stale and time_model is None:
            raise ConfigError("the harness runs the planner on modelled time: pass a "
                              "TimeModel (exploration window, seconds per sample-step, spot "
                              "slots), or set planner.enabled: false")
        self.planner = (ExplorationPlanner(config.planner, config.sampler)
                        if config.planner.enabled and stale else None)
        self.time_model = time_model
        self.plans: dict[int, Plan] = {}   # iteration -> the plan that explored it
        self.config = config.with_values({"mode": mode, "stream_latents": False})
        self.mode, self.stale_exploration = mode, stale
        self.store = RunStore.open(f"memory://harness-{uuid.uuid4().hex}")
        self.store.save_checkpoint(0, base_policy(self.config, progress=False).state_dict(),
                                   None)
        self.train_prompts = world_prompts(self.config, "train")
        self.val_prompts = world_prompts(self.config, "val")
        self.monitor = RankFidelityMonitor(self.config.fidelity)
        self.stale: dict[int, core.PerPrompt] = {}   # iteration -> the candidates θ_k-1 scored
        self.audits: dict[int, core.Audit] = {}      # iteration -> its audit's scores and τ
        self.last_val_rewards: np.ndarray | None = None
        base = self.validate(0) if base_val_reward is None else float(base_val_reward)
        self.run = HarnessRun(mode, self.config.seed, base)

    @property
    def attempt(self) -> Attempt:
        """Every request here runs once, in this process: attempt 1 of this store's driver."""
        return Attempt(self.store.epoch, 1)

    def prompts(self, k: int) -> list[Prompt]:
        grpo = self.config.grpo
        return iteration_prompts(self.train_prompts, k, grpo.prompts_per_iteration,
                                 self.config.seed)

    def validate(self, version: int) -> float:
        out = tasks.validation_task(self.config, self.store, max(version - 1, 0),
                                    self.val_prompts, version)
        self.last_val_rewards = out["rewards"]   # per validation prompt and seed
        return float(out["mean_reward"])

    def run_iterations(self, iterations: int, validate_every: int | None = None,
                       report: Callable[[HarnessIteration], None] | None = None,
                       stop: Callable[[HarnessRun], bool] | None = None) -> HarnessRun:
        """Iterations ``len(run.iterations)`` .. ``iterations - 1``; validation as the driver
        schedules it (every ``validation.every`` and after the last); ``report`` sees each.
        ``stop``, asked after each validation, ends the run early (the iterations it ran are
        those of the full run: the budget, not the stop, decides what each explores)."""
        every = validate_every or self.config.validation.every
        for k in range(len(self.run.iterations), iterations):
            validate = (k + 1) % every == 0 or k + 1 == iterations
            self.run.iterations.append(self.iteration(k, k + 1 < iterations, validate))
            if report is not None:
                report(self.run.iterations[-1])
            if validate and stop is not None and stop(self.run):
                break
        return self.run

    def iteration(self, k: int, explore_next: bool, validate: bool) -> HarnessIteration:
        cfg, prompts = self.config, self.prompts(k)
        selection, source = self.seeds_for(k, prompts)
        tau = self.audit(k, prompts) if self.stale_exploration else None
        if explore_next and self.stale_exploration:   # θ_k explores k+1 (while θ_k trains)
            self.stale[k + 1] = self.explore_planned(k + 1, k)
        rollout, rewards, reused = self.rollout(
            tasks.RolloutRequest(k, prompts, selection.seeds, k), selection, source)
        adv = tasks.advantages_task(cfg, k, rewards, k)
        self.pay_planner(k, adv)
        trained = tasks.train_task(cfg, self.store, rollout,
                                   tasks.TrainRequest(k, prompts, rewards, adv, k))
        saved = tasks.checkpoint_task(cfg, self.store, trained, k, k)
        self.store.commit_checkpoint(saved["checkpoint"])
        if tau is not None:
            self.monitor.observe(k, tau)
        plan = self.plans.get(k + 1)
        return HarnessIteration(k, float(rewards.mean()), float(rewards.std(axis=1).mean()),
                                source, tau, self.validate(k + 1) if validate else None,
                                (plan.candidates, plan.steps, plan.prompts) if plan else None,
                                reused)

    def rollout(self, request: tasks.RolloutRequest, selection: Selection,
                source: str) -> tuple[tasks.RolloutOutput, np.ndarray, bool]:
        """The iteration's rollout and rewards, and whether they are the explored samples
        themselves (where ``objective.train_on_explored`` may use them) or sampled and scored."""
        cfg = self.config
        if trains_on_explored(cfg, selection):
            reused = explored_rollout_task(cfg, self.store, request, selection, source)
            if reused["found"]:
                return tasks.load_rollout_task(cfg, self.store, request.iteration), \
                    reused["rewards"], True
        rollout = rollout_task(cfg, self.store, request, self.attempt)
        scored = tasks.reward_task(cfg, self.store, rollout, request.prompts,
                                   cfg.grpo.group_size, request.iteration)
        return rollout, scored["rewards"], False

    # --- the planner on modelled time ----------------------------------------------------------
    def explore_planned(self, iteration: int, version: int) -> list[tuple[list, list]]:
        """As :meth:`Exploration.plan` + ``submit``: the planner's N candidates at M steps on its
        first prompts (the rest get random seeds), or the fixed arm with the planner off."""
        cfg = self.config
        if self.planner is None:
            return self.explore(iteration, version, cfg.exploration.candidates)
        model, prompts = self.time_model, self.prompts(iteration)
        plan = self.planner.plan(iteration, len(prompts), cfg.grpo.group_size, model.spot_slots,
                                 [model.window_s], model.sec_per_sample_step,
                                 cfg.exploration.steps or cfg.sampler.num_steps,
                                 model.rollout_s if cfg.objective.train_on_explored else None)
        self.plans[iteration] = plan
        explored = (self.explore(iteration, version, plan.candidates, "explore",
                                 prompts[:plan.prompts], plan.steps)
                    if plan.candidates and plan.prompts else [])
        return explored + [([], []) for _ in prompts[len(explored):]]

    def pay_planner(self, k: int, adv: dict) -> None:
        """As :meth:`Exploration.record_plan_outcome`, with the modelled seconds: the spread
        the rollout of k got from its selection, per spot-second billed for the window."""
        plan, stale = self.plans.get(k), self.stale.get(k)
        if self.planner is None or plan is None or not stale or not any(s for s, _ in stale):
            return
        group, model = self.config.grpo.group_size, self.time_model
        random_std = random_group_std([r for _, r in stale], group)
        self.planner.record(plan, model.explore_s(plan), float(np.mean(adv["group_std"])),
                            random_std, model.window_s * model.spot_slots)

    # --- seeds -------------------------------------------------------------------------------
    def seeds_for(self, k: int, prompts: list[Prompt]) -> tuple[Selection, str]:
        """As :meth:`Exploration.seeds_for`: sync explores now; spotlight selects among the
        candidates θ_k-1 scored, or falls back when the audit stopped trusting them."""
        cfg = self.config
        stale = self.stale.get(k) if self.stale_exploration else None
        source = seed_source(self.mode, self.monitor.state != "fallback", cfg.fidelity.fallback,
                             stale is not None)
        if source == "sync":
            stale = self.explore(k, k, cfg.exploration.candidates, "explore-sync")
        return core.selection_of(source, cfg.seed, k, len(prompts), cfg.grpo.group_size,
                                 stale), source

    def explore(self, iteration: int, version: int, candidates: int, stage: str = "explore",
                prompts: list[Prompt] | None = None,
                steps: int | None = None) -> list[tuple[list, list]]:
        """Score ``candidates`` seeds per prompt of ``iteration`` (or of its first ``prompts``)
        with θ_version, in the pipeline's requests (one per prompt and
        ``exploration.request_batch`` candidates)."""
        prompts = prompts or self.prompts(iteration)
        return core.gather([scored(tasks.explore_task(self.config, self.store, request,
                                                      self.attempt))
                            for request in explore_requests(self.config, iteration, prompts,
                                                            version, stage, candidates, steps)],
                           len(prompts))

    def audit(self, k: int, prompts: list[Prompt]) -> float | None:
        """As :meth:`Exploration.submit_audit`: random stale candidates of k re-scored with θ_k;
        Kendall τ between the two rankings, per prompt, averaged."""
        stale, fidelity = self.stale.get(k), self.config.fidelity
        if stale is None or not audit_due(k, fidelity.audit_every):
            return None
        picks = core.audit_candidates(self.config.seed, k, stale, fidelity.audit_prompts,
                                      fidelity.audit_candidates)
        steps = core.audit_steps(self.plans.get(k))   # the steps the stale exploration took
        self.audits[k] = core.audit_tau(stale, [scored(tasks.explore_task(
            self.config, self.store, tasks.ExploreRequest(k, p, prompts[p], seeds, 0, k, "audit",
                                                          steps), self.attempt))
            for p, seeds in picks])
        return self.audits[k].kendall_tau

    def staleness_taus(self, k: int, lags: list[int], prompts: int,
                       candidates: int) -> dict[int, float | None]:
        """How fast a ranking goes stale: Kendall τ between θ_k's scores of random candidates of
        iteration k (the first ``prompts`` prompts) and θ_k-lag's scores of the same candidates,
        per lag (None where k < lag or every ranking tied). The run keeps its checkpoints."""
        chosen = self.prompts(k)[:prompts]
        fresh = self.explore(k, k, candidates, "audit", chosen)
        taus: dict[int, float | None] = {}
        for lag in lags:
            if lag > k:
                taus[lag] = None
                continue
            stale = self.explore(k, k - lag, candidates, "audit", chosen)
            tau = grouped_kendall_tau([r for _, r in stale], [r for _, r in fresh])
            taus[lag] = None if np.isnan(tau) else float(tau)
        return taus

    def close(self) -> None:
        reset_runtime()
