"""The driver of a run: builds each RL iteration as Dask futures and checkpoints every stage.

Iteration k, weights version k (θ_k)::

    gpu:  rollout(θ_k, P_k, S_k) -> reward -> advantages -> train θ_k -> θ_k+1 -> checkpoint
    spot: explore(θ_k, P_k+1, N seeds)  (from the start: exploration.window "iteration";
                                         or while training only: window "train")
    driver: at the training deadline keep what finished -> select S_k+1 -> [validate θ_k+1]

``sync`` mode explores P_k with θ_k on gpu workers before the rollout; ``vanilla`` does not
explore. A stage is recorded in the run manifest only after its data is in the run store, and
a recorded stage is never recomputed: the driver can be killed anywhere and resumed.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any, Callable

import numpy as np

from pipelines.cluster import GPU, ClusterHandle, RunInterrupted, task_error
from pipelines.cluster.classes import Silent, scheduler_workers
from pipelines.observe.validation_grid import grid_of, save_grid, validation_labels
from pipelines.run import recording, tasks
from pipelines.run.context import CarriedOver
from pipelines.run.dp_train import data_parallel, dp_train
from pipelines.run.exploration import Exploration, MeasuredTime
from pipelines.run.explored import explored_rollout_task
from pipelines.run.rollout import (
    OneGpuTask,
    PulledRequests,
    RolloutBackend,
    finish_rollout,
    rollout_request_of,
    rollout_requests,
)
from pipelines.run.sharded_train import sharded_train
from pipelines.run.sp_rollout import SPGroupsBackend
from pipelines.run.stage_log import StageLog
from pipelines.run.stages import (
    IterationRecord,
    RewardResult,
    RolloutResult,
    Stage,
    TrainResult,
    ValidationResult,
)
from pipelines.run.state import IterationResult, IterationWork, iteration_result
from spotlight.config import RunConfig, rollout_sp_degree
from spotlight.cost import CostLedger, run_prices
from spotlight.exploration import Selection
from spotlight.iteration import IterationOutcome, IterationProgram, drive, pulled, requests
from spotlight.models.prompts import Prompt
from spotlight.scheduling.liveness import SilenceReports
from storage import RunStore

EventFn = Callable[[str, dict], None]


# What goes into the run store's event log (``RunStore.read_events``): what an operator audits
# after a night on spot capacity. Stage progress and per-iteration results have their own records.
RECORDED_EVENTS = frozenset({"dispatch", "preemptions", "injector", "fidelity", "request",
                             "sp_rollout", "lease"})


class Driver:
    """Runs iterations of one run on one cluster; the state lives in the run store."""

    def __init__(self, config: RunConfig, store: RunStore, cluster: ClusterHandle, mode: str,
                 train_prompts: list[Prompt], val_prompts: list[Prompt],
                 on_event: EventFn | None = None) -> None:
        self.config, self.store, self.cluster, self.mode = config, store, cluster, mode
        self.train_prompts, self.val_prompts = train_prompts, val_prompts
        self.on_event = on_event or (lambda kind, info: None)
        self.prices = run_prices(config.cost)
        self.log = StageLog(store, on_record=self._stage_recorded)   # what is done, typed
        self.ledger = self._restored_ledger()
        self._attempt = uuid.uuid4().hex[:6]
        self._events: list[dict] = []       # operator events not yet in the run store
        self._events_lock = threading.Lock()
        self.first_validation: dict | None = None   # the first validation this driver ran
        self.last_validation: dict | None = None
        self._stop = threading.Event()
        self.carried = CarriedOver()   # formed on first use, kept across iterations
        self.exploration = Exploration(self)   # exploration requests on the cluster
        # Every decision of an iteration is the program's; this driver carries its requests out.
        self.program = IterationProgram(config, mode, train_prompts, self.log,
                                        MeasuredTime(self, self.exploration),
                                        self._restored_planning())
        self._work: IterationWork | None = None   # the iteration under way

    def stop(self) -> None:
        """Stop at the next wait: in-flight tasks are cancelled, committed stages stay."""
        self._stop.set()

    def check_running(self) -> None:
        if self._stop.is_set():
            raise RunInterrupted("the run was stopped")

    def await_futures(self, futures: list, what: str, resource: str = GPU) -> None:
        """Wait for Dask futures, stopping on :meth:`stop` and when their workers are gone; a
        worker of ``resource`` that goes unheard meanwhile is named (:meth:`_silent`)."""
        self.cluster.wait_for(futures, resource, self._stop, self.config.cluster.worker_wait_s,
                              what, self._silent())

    def _silent(self) -> Silent:
        def tell(worker: str, quiet: float, what: str) -> None:
            self.emit("dispatch", what="unheard", worker=worker, silent_s=quiet, waiting=what)

        return Silent(SilenceReports(self.config.preemption.heartbeat_silence_s), tell)

    def result(self, future, what: str, resource: str = GPU):
        """The result of one task, or one clear error naming the stage if it raised."""
        self.await_futures([future], what, resource)
        if future.status == "error":
            raise task_error(future.exception(), what, resource)
        return self.fetch([future], what, resource)[0]

    def fetch(self, futures: list, what: str, resource: str = GPU) -> list:
        """The results of finished futures in one batch; one whose worker died before it was
        fetched is computed again and waited for, as :meth:`await_futures` waits."""
        return self.cluster.results(futures, resource, self._stop,
                                    self.config.cluster.worker_wait_s, what, self._silent())

    def _restored_ledger(self) -> CostLedger:
        """The ledger of the last recorded iteration; its workers count as gone since then."""
        k = self.log.completed_iterations()
        if k == 0:
            return CostLedger()
        last = self.log.get(k - 1, Stage.ITERATION)
        ledger = CostLedger.from_dict(last.ledger)
        for name in ledger.alive_workers():
            ledger.worker_left(name, last.result["end"])
        return ledger

    def warm_up(self) -> list:
        """Load the newest weights in every worker now, in the background (futures returned)."""
        version = self.store.latest_checkpoint() or 0
        workers = scheduler_workers(self.cluster.client)
        return [self.cluster.client.submit(tasks.warm_up_task, self.config, self.store, version,
                                           workers=[address], allow_other_workers=False,
                                           pure=False, key=f"warm-up-{self._attempt}-{i}")
                for i, address in enumerate(workers)]

    # --- helpers --------------------------------------------------------------------------------
    def placed(self, stage: str) -> tuple[str, ...]:
        """The worker classes ``stage`` runs on in this run's mode (``placement``)."""
        return self.config.placed(stage, self.mode)

    def worker_class(self, stage: str) -> str:
        """The one worker class of a single-task stage (reward, train)."""
        return self.placed(stage)[0]

    def submit(self, fn, *args, resource: str, name: str, **kwargs):
        return self.cluster.client.submit(fn, *args, resources={resource: 1}, pure=False,
                                          key=f"{name}-{self._attempt}-{uuid.uuid4().hex[:8]}",
                                          **kwargs)

    def emit(self, kind: str, /, **info: Any) -> None:
        if kind in RECORDED_EVENTS:
            self.record_event(kind, info)
        self.on_event(kind, info)

    def record_event(self, kind: str, info: dict) -> None:
        """Keep an operator event for the run store's event log (written per iteration)."""
        info = {("what" if k == "kind" else k):   # the injector's own kind: kill, notice, ...
                dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                for k, v in info.items()}
        with self._events_lock:
            self._events.append({"kind": kind, "at": info.get("at", time.time()), **info})

    def flush_events(self, batch: str) -> None:
        """Write the events kept since the last flush as ``events/<batch>-<driver>.jsonl``."""
        with self._events_lock:
            events, self._events = self._events, []
        self.store.write_events(f"{batch}-{self._attempt}", events)

    def _track_workers(self) -> None:
        """Feed the cost ledger with who is alive now (workers join and leave between polls)."""
        now = time.time()
        alive = self.cluster.workers_by_class()
        seen = {name for names in alive.values() for name in names}
        for cls, names in alive.items():
            for name in names:
                self.ledger.worker_joined(name, cls, now)
        for name in self.ledger.alive_workers():
            if name not in seen:
                self.ledger.worker_left(name, now)

    def _stage_recorded(self, iteration: int | None, stage: str) -> None:
        if iteration is not None:
            self.emit("stage_done", iteration=iteration, stage=stage)

    def prompts(self, iteration: int) -> list[Prompt]:
        return self.program.prompts(iteration)

    def _restored_planning(self) -> dict | None:
        """Planner and fidelity monitor as the last recorded iteration left them."""
        k = self.log.completed_iterations()
        if k == 0:
            return None
        record = self.log.get(k - 1, Stage.ITERATION)
        # Runs recorded before the planning state left the manifest keep it in the record.
        if record.planner is not None:
            return {"planner": record.planner, "monitor": record.monitor}
        return self.store.get_json(tasks.stage_name(k - 1, "iteration"), "planning")

    # --- one iteration --------------------------------------------------------------------------
    def run_iteration(self, k: int, *, validate: bool, explore_next: bool) -> IterationResult:
        """Run (or finish, or just read back) iteration k: θ_k -> θ_k+1."""
        done = self.log.get(k, Stage.ITERATION)
        if done is not None:
            return IterationResult(**done.result)
        self.check_running()
        self.log.refresh()                  # one manifest read per iteration (none as writer)
        self._track_workers()
        self._work = IterationWork(k, start=time.time())
        try:
            outcome = drive(self.program.iteration(k, validate=validate,
                                                   explore_next=explore_next), self.handle)
            return self._finish(self._work, outcome)
        finally:
            self._work = None

    def handle(self, request: requests.StageRequest) -> Any:
        """Carry out one request of the iteration program (see :mod:`spotlight.iteration`)."""
        return getattr(self, f"_{type(request).__name__}")(request)

    def _ReadSelection(self, r: requests.ReadSelection) -> Selection:
        return recording.read_selection(self.store, self.log, r.iteration)

    def _ReadCandidates(self, r: requests.ReadCandidates) -> requests.Candidates:
        return recording.candidates_of(self.exploration.candidates(r.iteration, r.stage))

    def _ReadRewards(self, r: requests.ReadRewards) -> np.ndarray:
        return recording.read_rewards(self.store, r.iteration)

    def _RecordPlan(self, r: requests.RecordPlan) -> None:
        recording.record_plan(self.log, r.plan, r.at)
        if r.announce:
            self.emit("plan", iteration=r.plan.iteration, plan=r.plan)

    def _RecordSelection(self, r: requests.RecordSelection) -> None:
        recording.record_selection(self.store, self.log, r.iteration, r.selection, r.source)

    def _RecordAudit(self, r: requests.RecordAudit) -> None:
        recording.record_audit(self.store, self.log, r.iteration, r.audit, r.scored)
        self._work.records += [out.record for out in r.scored]

    def _StageStarted(self, r: requests.StageStarted) -> None:
        self.emit("stage_start", iteration=r.iteration, stage=r.stage)

    def _FidelityChanged(self, r: requests.FidelityChanged) -> None:
        self.emit("fidelity", iteration=r.decision.iteration, decision=r.decision)

    def _EmbedPrompts(self, r: requests.EmbedPrompts) -> None:
        """The prompt embeddings this iteration's workers read, into the run store first."""
        texts = r.texts + [p.text for p in self.val_prompts]
        where = self.worker_class("train")
        self.result(self.submit(tasks.embed_prompts_task, self.config, self.store, r.iteration,
                                texts, resource=where, name="embed"),
                    f"prompt embeddings of iteration {r.iteration}", where)

    def _StartExploration(self, r: requests.StartExploration):
        return self.exploration.start(r)

    def _FinishExploration(self, r: requests.FinishExploration) -> requests.Candidates:
        waiting = time.time()
        found = self.exploration.finish(r)
        it = self._work
        if r.stage == Stage.EXPLORE and r.iteration == it.k + 1:   # the next one's, stale
            it.explore_wait_s = time.time() - waiting
            it.records += found["tasks"]
            it.preemptions += self.log.get(r.iteration, Stage.EXPLORE).preemptions
        return recording.candidates_of(found)

    def _StartAudit(self, r: requests.StartAudit):
        return self.exploration.start_audit(r)

    def _FinishAudit(self, r: requests.FinishAudit) -> list | None:
        return self.exploration.finish_audit(r.work)

    def _RollOutExplored(self, r: requests.RollOutExplored) -> bool:
        """The selected seeds' explored samples become the rollout (recorded here), joined
        with the other prompts' rollout where exploration covered only some; all explored:
        their exploration rewards are its rewards (written here, read by the reward stage)."""
        where = self.worker_class("train")
        request = tasks.RolloutRequest(r.iteration, r.prompts, r.selection.seeds, r.iteration)
        out = self.result(self.submit(explored_rollout_task, self.config, self.store, request,
                                      r.selection, r.stage, r.rows, self._work.part_start,
                                      resource=where, name="explored-rollout"),
                          f"iteration {r.iteration}'s explored samples", where)
        if out["found"]:
            self._work.records.append(out["record"])
            self.log.record(r.iteration, Stage.ROLLOUT, RolloutResult(task=out["record"]))
        return bool(out["found"])

    def _RollOut(self, r: requests.RollOut) -> None:
        request = rollout_request_of(r)
        self._work.part_start = time.time() if request.part else None
        chunks = rollout_requests(self.config, request)
        done = self._rollout_backend().run(self, chunks)
        self._work.records += finish_rollout(self.store, self.log, chunks, request.seeds, done)
        self._work.rollout_f = None if request.part else done.held   # a part: never held

    def _rollout_held(self, k: int):
        """The future of iteration k's rollout: held in its worker's memory, else read back
        from the run store (a resumed run, a pulled rollout)."""
        it = self._work
        if it.rollout_f is None:
            it.rollout_f = self.submit(tasks.load_rollout_task, self.config, self.store, k,
                                       resource=self.worker_class("reward"), name="load-rollout")
        return it.rollout_f

    def _rollout_backend(self) -> RolloutBackend:
        if rollout_sp_degree(self.config) > 1:
            return SPGroupsBackend()
        return PulledRequests() if pulled(self.placed("rollout")) else OneGpuTask()

    def _Score(self, r: requests.Score) -> np.ndarray:
        """Score the rollout (its data is in the store by then), or take the explored samples'
        rewards (written with them, never re-scored)."""
        k, where = r.iteration, self.worker_class("reward")
        if r.explored:
            rewards = recording.read_rewards(self.store, k)
            task = self.log.get(k, Stage.ROLLOUT).task
        else:
            out = self.result(self.submit(tasks.reward_task, self.config, self.store,
                                          self._rollout_held(k), r.prompts,
                                          self.config.grpo.group_size, k, resource=where,
                                          name="reward"),
                              f"iteration {k}'s rollout and reward", where)
            rewards, task = out["rewards"], out["record"]
            self._work.records.append(task)
        self.log.record(k, Stage.REWARD, RewardResult(mean=float(rewards.mean()), task=task))
        return rewards

    def _ComputeAdvantages(self, r: requests.ComputeAdvantages) -> dict:
        k, where = r.iteration, self.worker_class("train")
        adv = self.result(self.submit(tasks.advantages_task, self.config, k, r.rewards, k,
                                      resource=where, name="advantages"),
                          f"iteration {k}'s advantages", where)
        self._work.records.append(adv["record"])
        if self.log.done(k, Stage.TRAIN):   # resumed: trained already, the window is over
            self._work.train_end = time.time()
        return adv

    def _Train(self, r: requests.Train) -> dict:
        k, where = r.iteration, self.worker_class("train")
        self.store.checkpoints.withdraw(k + 1)   # a crash may have left one half-recorded
        request = tasks.TrainRequest(k, r.prompts, r.rewards, r.advantages, k)
        if self.config.parallel.shard_training:   # over every gpu worker, each with a shard
            trained = sharded_train(self, request)
        elif data_parallel(self):   # every gpu worker takes the step (rank 0's state is saved)
            trained = dp_train(self, request)
        else:
            trained = self.submit(tasks.train_task, self.config, self.store,
                                  self._rollout_held(k), request, resource=where, name="train")
        saved = self.result(self.submit(tasks.checkpoint_task, self.config, self.store, trained,
                                        k, k, resource=where, name="checkpoint"),
                            f"iteration {k}'s training and checkpoint", where)
        del trained   # the weights leave the gpu worker's memory with the future
        self.store.commit_checkpoint(saved["checkpoint"])   # θ_k+1 exists from here on
        self._work.records += saved["records"]
        self._work.rollout_f = None
        self.log.record(k, Stage.TRAIN, TrainResult(stats=saved["stats"],
                                                     task=saved["records"][0]))
        self._work.train_end = time.time()
        return saved["stats"]

    def _Validate(self, r: requests.Validate) -> float:
        return self.validate(r.version, self._work.records)

    def _finish(self, it: IterationWork, outcome: IterationOutcome) -> IterationResult:
        """Record the iteration: rewards table, tasks, planning state, events, its result."""
        k = it.k
        self._append_rewards(outcome)
        self._track_workers()
        end = time.time()
        plan = outcome.plan
        if plan is not None and plan.budget_s is not None:
            ends = [t["end"] for t in it.records if t["stage"] == "explore"]
            it.overrun = bool(ends) and max(ends) > it.train_end
        result = iteration_result(outcome, it, self.mode, end,
                                  self.ledger.cost(it.start, end, self.prices)["total"],
                                  self.ledger.total(end, self.prices)["total"])
        self.store.put_json(tasks.stage_name(k, "iteration"), "tasks",
                            {"tasks": it.records, "train_end": it.train_end})
        self.store.put_json(tasks.stage_name(k, "iteration"), "planning",
                            self.program.planning_state())
        self.flush_events(f"iter-{k:06d}")
        self.log.record(k, Stage.ITERATION,
                        IterationRecord(result.to_record(), self.ledger.to_dict()))
        self.emit("iteration_done", iteration=k, result=result)
        return result

    def validate(self, version: int, records: list | None = None) -> float:
        """Validate θ_version on the held-out prompts (recorded; never recomputed)."""
        iteration, stage = (None, "base-validation") if version == 0 else \
            (version - 1, "validation")
        result, _ = self.log.once(iteration, stage, lambda: self._validate_now(version, records))
        return float(result.mean_reward)

    def _validate_now(self, version: int, records: list | None) -> ValidationResult:
        self.emit("stage_start", iteration=max(version - 1, 0), stage="validation")
        where = self.worker_class("train")
        out = self.result(self.submit(tasks.validation_task, self.config, self.store, version,
                                      self.val_prompts, version, resource=where,
                                      name="validation"), f"validation of weights {version}",
                          where)
        self.last_validation = out
        self.first_validation = self.first_validation or out
        labels = validation_labels(self.val_prompts, out["rewards"])
        grid = grid_of(version, out["images"], out["rewards"], labels, out["mean_reward"])
        save_grid(self.store, grid)   # once per version: inside the stage log's ``once``
        self.emit("validation_done", iteration=max(version - 1, 0), version=version, grid=grid)
        if records is not None:
            records.append(out["record"])
        return ValidationResult(float(out["mean_reward"]), version, out["record"])

    def _append_rewards(self, outcome: IterationOutcome) -> None:
        """One table row per scored sample of an iteration: its rollout, the audited and the
        explored candidates."""
        k, prompts, selection = outcome.iteration, outcome.prompts, outcome.selection
        cols: dict[str, list] = {"prompt": [], "seed": [], "stage": [], "reward": [],
                                 "weights_version": [], "advantage": [], "selected": [],
                                 "kendall_tau": []}
        nan = float("nan")

        def add(prompt, seed, stage, reward, version, advantage, selected, tau=None):
            for key, value in zip(cols, (prompt, seed, stage, reward, version, advantage, selected,
                                         nan if tau is None else tau)):
                cols[key].append(value)

        values = outcome.advantages["values"]
        for p, prompt in enumerate(prompts):
            for g, seed in enumerate(selection.seeds[p]):
                add(prompt.text, int(seed), "rollout", float(outcome.rewards[p, g]), k,
                    float(values[p, g]), 1.0, outcome.tau)
        if self.log.done(k, Stage.AUDIT):
            audit = recording.read_audit(self.store, k)
            for p, seeds, fresh in zip(audit["prompt_index"], audit["seeds"], audit["fresh"]):
                for seed, reward in zip(seeds, fresh):
                    add(prompts[p].text, int(seed), "audit", float(reward), k, nan, nan,
                        outcome.audit_tau)
        for stage in ("explore", "explore-sync"):
            if self.log.done(k, stage):
                found = self.exploration.candidates(k, stage)
                version = k - 1 if stage == "explore" else k
                chosen = [set(int(s) for s in row) for row in selection.seeds]
                for p, (seeds, rews) in enumerate(zip(found["seeds"], found["rewards"])):
                    for seed, reward in zip(seeds, rews):
                        add(prompts[p].text, int(seed), stage, float(reward), version, nan,
                            float(int(seed) in chosen[p]))
        self.store.append_rewards(k, cols)
