"""The in-process executor of the iteration program: the workers' task functions, called in
order in this process, on a run store of its own (``memory://`` unless given one).

It runs the very program the Dask driver runs (:mod:`spotlight.iteration.program`) and answers
its requests with the very task functions the workers run, with the workers' torch thread count,
recording stages in a stage log as the driver does. So a run here computes exactly what a
cluster run computes -- seeds, exploration with θ_k-1 for iteration k, selection, audit and
fidelity fallback, rollout, reward, advantages, training -- bit for bit. What it leaves out does
not change the numbers: Dask, streamed latents, events, the cost ledger. Iteration efficiency
(iterations to a target) is measured here, many seeds in one sitting; time per iteration on
the cluster.

Exploration runs every planned request (``exploration.deadline`` off: the deadline depends on
measured time). The planner plans with modelled time (:class:`~spotlight.iteration.TimeModel`:
the exploration window and the spot workers' seconds per sample-step, measured on a cluster,
and how many spot slots there are); with ``planner.enabled`` off every iteration explores
``exploration.candidates`` at the rollout's steps.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.cluster.runtime import reset_runtime
from pipelines.run import recording, rollout_store, tasks
from pipelines.run.exploration import explore_requests
from pipelines.run.explored import explored_rollout_task
from pipelines.run.rollout import (
    RolloutDone,
    finish_rollout,
    rollout_request_of,
    rollout_requests,
    rollout_task,
)
from pipelines.run.stage_log import StageLog
from pipelines.run.stages import (
    IterationRecord,
    RewardResult,
    RolloutResult,
    Stage,
    TrainResult,
    ValidationResult,
)
from spotlight.config import ConfigError, RunConfig
from spotlight.exploration import core
from spotlight.exploration.fidelity import grouped_kendall_tau
from spotlight.exploration.planner import Plan
from spotlight.iteration import (
    IterationOutcome,
    IterationProgram,
    NoPlanningTime,
    TimeModel,
    drive,
    requests,
    validation_due,
)
from spotlight.models.prompts import Prompt, world_prompts
from spotlight.modes import MODE_NAMES, MODES
from storage import RunStore
from storage.attempts import Attempt


@dataclass
class IterationSummary:
    """What one in-process iteration measured."""

    iteration: int
    rollout_reward: float
    group_std: float  # mean within-prompt std of the rollout rewards
    source: str  # where the seeds came from: random, explore, sync, ...
    audit_tau: float | None = None  # stale vs fresh ranking of random candidates
    val_reward: float | None = None  # of θ_k+1, when validated
    plan: tuple[int, int, int] | None = None  # the planner's N, M and prompts for k+1
    trained_on_explored: bool = False  # its rollout was the explored samples (no sampling)
    train_stats: dict = field(default_factory=dict)
    zero_std_groups: int = 0  # groups whose rewards were all equal (no signal)
    wall_s: float = field(default=0.0, compare=False)  # measured: two runs differ
    sampled: float = 1.0  # the share of its samples a rollout drew (the rest were explored)


@dataclass
class InProcessHistory:
    mode: str
    seed: int
    base_val_reward: float
    iterations: list[IterationSummary] = field(default_factory=list)

    def val_curve(self) -> list[tuple[int, float]]:
        """(iterations trained, validation reward), from the base model on."""
        return [(0, self.base_val_reward)] + [
            (it.iteration + 1, it.val_reward) for it in self.iterations if it.val_reward is not None
        ]


class InProcessRun:
    """One run of ``mode`` from the cached base model, iteration by iteration, in process."""

    def __init__(
        self,
        config: RunConfig,
        mode: str,
        base_val_reward: float | None = None,
        time_model: TimeModel | None = None,
        progress: bool = False,
        store: str | None = None,
        stream_latents: bool = False,
    ) -> None:
        """``base_val_reward``: the base model's validation reward when the caller measured it
        already (it depends on neither the mode nor the run seed), saving one validation.
        ``time_model``: what the planner plans with (needed with ``planner.enabled``).
        ``store``: the run store's URL (default: a new ``memory://`` one); ``stream_latents``:
        write every denoising step as a cluster run does (it changes no number)."""
        if mode not in MODES:
            raise ConfigError(f"in-process mode {mode!r}: choose one of {', '.join(MODE_NAMES)}")
        stale = MODES[mode].stale
        if config.exploration.deadline and MODES[mode].explores:
            raise ConfigError(
                "an in-process run explores without a clock: set exploration.deadline: false"
            )
        if config.planner.enabled and stale and time_model is None:
            raise ConfigError(
                "an in-process run plans on modelled time: pass a TimeModel "
                "(exploration window, seconds per sample-step, spot slots), or "
                "set planner.enabled: false"
            )
        self.config = config.with_values({"mode": mode, "stream_latents": stream_latents})
        self.mode, self.time_model = mode, time_model
        self.store = RunStore.open(store or f"memory://inprocess-{uuid.uuid4().hex}")
        self.store.save_checkpoint(0, tasks.prepared_base(self.config, progress).state_dict(), None)
        self.log = StageLog(self.store)
        self.train_prompts = world_prompts(self.config, "train")
        self.val_prompts = world_prompts(self.config, "val")
        self.program = IterationProgram(
            self.config, mode, self.train_prompts, self.log, time_model or NoPlanningTime()
        )
        self.plans: dict[int, Plan] = {}  # iteration -> the plan that explored it
        self.last_val_rewards: np.ndarray | None = None
        self.last_validation: dict | None = None
        self._candidates: dict[tuple[int, str], requests.Candidates] = {}
        self._rollouts: dict[int, tasks.RolloutOutput] = {}
        self._part_start: float | None = None  # when the unexplored prompts' rollout began
        base = self.validate(0) if base_val_reward is None else float(base_val_reward)
        self.run = InProcessHistory(mode, self.config.seed, base)

    @property
    def reward_fn(self):
        """The reward the run's tasks score with."""
        return tasks.context(self.config, self.store).reward_fn

    @property
    def attempt(self) -> Attempt:
        """Every request here runs once, in this process: attempt 1 of this store's driver."""
        return Attempt(self.store.epoch, 1)

    def prompts(self, k: int) -> list[Prompt]:
        return self.program.prompts(k)

    def validate(self, version: int) -> float:
        """Validate θ_version (recorded; a version validated before is read back)."""
        iteration, stage = (
            (None, Stage.BASE_VALIDATION) if version == 0 else (version - 1, Stage.VALIDATION)
        )
        recorded = self.log.get(iteration, stage)
        if recorded is not None:
            return float(recorded.mean_reward)
        out = tasks.validation_task(
            self.config, self.store, max(version - 1, 0), self.val_prompts, version
        )
        self.last_val_rewards, self.last_validation = out["rewards"], out
        self.log.record(
            iteration, stage, ValidationResult(float(out["mean_reward"]), version, out["record"])
        )
        return float(out["mean_reward"])

    def run_iterations(
        self,
        iterations: int,
        validate_every: int | None = None,
        report: Callable[[IterationSummary], None] | None = None,
        stop: Callable[[InProcessHistory], bool] | None = None,
    ) -> InProcessHistory:
        """Iterations ``len(run.iterations)`` .. ``iterations - 1``; validation as the driver
        schedules it (every ``validation.every`` and after the last); ``report`` sees each.
        ``stop``, asked after each validation, ends the run early (the iterations it ran are
        those of the full run: the budget, not the stop, decides what each explores)."""
        config = (
            self.config
            if validate_every is None
            else self.config.with_values({"validation.every": validate_every})
        )
        for k in range(len(self.run.iterations), iterations):
            validate = validation_due(config, k, iterations)
            self.run.iterations.append(self.iteration(k, k + 1 < iterations, validate))
            if report is not None:
                report(self.run.iterations[-1])
            if validate and stop is not None and stop(self.run):
                break
        return self.run

    def iteration(self, k: int, explore_next: bool, validate: bool) -> IterationSummary:
        """Run iteration k of the program here."""
        start = time.monotonic()
        outcome: IterationOutcome = drive(
            self.program.iteration(k, validate=validate, explore_next=explore_next), self.handle
        )
        self.log.record(
            k,
            Stage.ITERATION,
            IterationRecord(
                {
                    "iteration": k,
                    "mode": self.mode,
                    "reward_mean": float(outcome.rewards.mean()),
                    "val_reward": outcome.val_reward,
                }
            ),
        )
        rewards, plan = outcome.rewards, outcome.plan
        return IterationSummary(
            k,
            float(rewards.mean()),
            float(rewards.std(axis=1).mean()),
            "sync" if outcome.source == "explore-sync" else outcome.source,
            outcome.audit_tau,
            outcome.val_reward,
            (plan.candidates, plan.steps, plan.prompts) if plan else None,
            outcome.explored_rollout,
            outcome.train_stats,
            int((~outcome.advantages["kept"]).sum()),
            time.monotonic() - start,
            outcome.rolled_out / rewards.size if outcome.explored_rollout else 1.0,
        )

    # --- the program's requests ------------------------------------------------------------------
    def handle(self, request: requests.StageRequest) -> Any:
        return getattr(self, f"_{type(request).__name__}")(request)

    def _ReadSelection(self, r: requests.ReadSelection):
        return recording.read_selection(self.store, self.log, r.iteration)

    def _ReadCandidates(self, r: requests.ReadCandidates) -> requests.Candidates:
        key = (r.iteration, r.stage)
        if key not in self._candidates:
            self._candidates[key] = recording.read_candidates(self.store, *key)[0]
        return self._candidates[key]

    def _ReadRewards(self, r: requests.ReadRewards) -> np.ndarray:
        return recording.read_rewards(self.store, r.iteration)

    def _RecordPlan(self, r: requests.RecordPlan) -> None:
        self.plans[r.plan.iteration] = r.plan
        recording.record_plan(self.log, r.plan, r.at)

    def _RecordSelection(self, r: requests.RecordSelection) -> None:
        recording.record_selection(self.store, self.log, r.iteration, r.selection, r.source)

    def _RecordAudit(self, r: requests.RecordAudit) -> None:
        recording.record_audit(self.store, self.log, r.iteration, r.audit, r.scored)

    def _StageStarted(self, r: requests.StageStarted) -> None:
        return None

    def _FidelityChanged(self, r: requests.FidelityChanged) -> None:
        return None

    def _EmbedPrompts(self, r: requests.EmbedPrompts) -> None:
        tasks.embed_prompts_task(
            self.config, self.store, r.iteration, r.texts + [p.text for p in self.val_prompts]
        )

    def _StartExploration(self, r: requests.StartExploration) -> list:
        return [
            tasks.explore_task(self.config, self.store, request, self.attempt)
            for request in explore_requests(
                self.config, r.iteration, r.prompts, r.version, r.stage, r.candidates, r.steps
            )
        ]

    def _FinishExploration(self, r: requests.FinishExploration) -> requests.Candidates:
        found = recording.store_candidates(
            self.store,
            self.log,
            r.iteration,
            r.stage,
            self.config.grpo.prompts_per_iteration,
            r.work,
            0,
            r.planned,
            None,
        )
        self._candidates[(r.iteration, r.stage)] = recording.candidates_of(found)
        return self._candidates[(r.iteration, r.stage)]

    def _StartAudit(self, r: requests.StartAudit) -> list:
        return [
            tasks.explore_task(
                self.config,
                self.store,
                tasks.ExploreRequest(
                    r.iteration, p, prompt, seeds, 0, r.iteration, "audit", r.steps
                ),
                self.attempt,
            )
            for p, prompt, seeds in r.picks
        ]

    def _FinishAudit(self, r: requests.FinishAudit) -> list:
        return r.work

    def _RollOutExplored(self, r: requests.RollOutExplored) -> bool:
        request = tasks.RolloutRequest(r.iteration, r.prompts, r.selection.seeds, r.iteration)
        out = explored_rollout_task(
            self.config, self.store, request, r.selection, r.stage, r.rows, self._part_start
        )
        if out["found"]:
            self._rollouts[r.iteration] = tasks.load_rollout_task(
                self.config, self.store, r.iteration
            )
            self.log.record(r.iteration, Stage.ROLLOUT, RolloutResult(task=out["record"]))
        return bool(out["found"])

    def _RollOut(self, r: requests.RollOut) -> None:
        request = rollout_request_of(r)
        self._part_start = time.time() if request.part else None
        out = rollout_task(self.config, self.store, request, self.attempt)
        self._rollouts = {} if request.part else {r.iteration: out}  # a part is joined first
        chunks = rollout_requests(self.config, request)
        finish_rollout(
            self.store,
            self.log,
            chunks,
            request.seeds,
            RolloutDone(
                [out.record],
                RolloutResult(task=out.record),
                files={c.name: rollout_store.request_file(c.name, self.attempt) for c in chunks},
            ),
        )

    def _rollout(self, k: int) -> tasks.RolloutOutput:
        held = self._rollouts.get(k)
        return held if held is not None else tasks.load_rollout_task(self.config, self.store, k)

    def _Score(self, r: requests.Score) -> np.ndarray:
        if r.explored:
            rewards = recording.read_rewards(self.store, r.iteration)
            task = self.log.get(r.iteration, Stage.ROLLOUT).task
        else:
            out = tasks.reward_task(
                self.config,
                self.store,
                self._rollout(r.iteration),
                r.prompts,
                self.config.grpo.group_size,
                r.iteration,
            )
            rewards, task = out["rewards"], out["record"]
        self.log.record(r.iteration, Stage.REWARD, RewardResult(float(rewards.mean()), task))
        return rewards

    def _ComputeAdvantages(self, r: requests.ComputeAdvantages) -> dict:
        return tasks.advantages_task(self.config, r.iteration, r.rewards, r.iteration)

    def _Train(self, r: requests.Train) -> dict:
        k = r.iteration
        trained = tasks.train_task(
            self.config,
            self.store,
            self._rollout(k),
            tasks.TrainRequest(k, r.prompts, r.rewards, r.advantages, k),
        )
        saved = tasks.checkpoint_task(self.config, self.store, trained, k, k)
        self.store.commit_checkpoint(saved["checkpoint"])
        self._rollouts.pop(k, None)
        self.log.record(k, Stage.TRAIN, TrainResult(saved["stats"], saved["records"][0]))
        return saved["stats"]

    def _Validate(self, r: requests.Validate) -> float:
        return self.validate(r.version)

    # --- measuring staleness (bench arms) --------------------------------------------------------
    def explore(
        self,
        iteration: int,
        version: int,
        candidates: int,
        stage: str = "explore",
        prompts: list[Prompt] | None = None,
        steps: int | None = None,
    ) -> list:
        """Score ``candidates`` seeds per prompt of ``iteration`` (or of its first ``prompts``)
        with θ_version, in the pipeline's requests; per prompt (seeds, rewards). Records
        nothing: a measurement beside the run."""
        prompts = prompts or self.prompts(iteration)
        outs = self._StartExploration(
            requests.StartExploration(iteration, version, stage, prompts, candidates, steps)
        )
        return core.gather([requests.scored_of(out) for out in outs], len(prompts))

    def staleness_taus(
        self, k: int, lags: list[int], prompts: int, candidates: int
    ) -> dict[int, float | None]:
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
