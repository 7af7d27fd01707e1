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

from pipelines.observe.validation_grid import grid_of, save_grid, validation_labels
from pipelines.run import tasks
from pipelines.cluster import GPU, ClusterHandle, RunInterrupted, task_error
from pipelines.run.exploration import Exploration, explore_window
from pipelines.run.explored import explored_rollout_task, trains_on_explored
from pipelines.run.rollout import (Pulled, RolloutBackend, SingleTask, finish_rollout, pulled,
                                   rollout_requests)
from pipelines.run.context import Standing
from pipelines.run.dp_train import data_parallel, dp_train
from pipelines.run.sp_rollout import SPGroupsBackend
from pipelines.run.stage_log import StageLog
from pipelines.run.stages import (IterationRecord, RewardResult, RolloutResult, Stage,
                                  TrainResult, ValidationResult)
from pipelines.run.state import IterationResult, IterationState
from spotlight.config import RunConfig, rollout_sp_degree
from spotlight.cost import CostLedger
from spotlight.exploration import Selection
from spotlight.models.base import stores_prompts
from spotlight.models.prompts import Prompt
from spotlight.modes import mode_of
from spotlight.rl.trainer import iteration_prompts
from storage import RunStore
from spotlight.cost import load_prices, worker_class_prices

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
        self.prices = _prices(config)
        self.log = StageLog(store, on_record=self._stage_recorded)   # what is done, typed
        self.ledger = self._restored_ledger()
        self._attempt = uuid.uuid4().hex[:6]
        self._events: list[dict] = []       # operator events not yet in the run store
        self._events_lock = threading.Lock()
        self.first_validation: dict | None = None   # the first validation this driver ran
        self.last_validation: dict | None = None
        self._stop = threading.Event()
        self.exploration = Exploration(self)   # plans, runs and judges seed exploration
        self.standing = Standing()   # formed on first use, kept across iterations

    def stop(self) -> None:
        """Stop at the next wait: in-flight tasks are cancelled, committed stages stay."""
        self._stop.set()

    def check_running(self) -> None:
        if self._stop.is_set():
            raise RunInterrupted("the run was stopped")

    def await_futures(self, futures: list, what: str, resource: str = GPU) -> None:
        """Wait for Dask futures, stopping on :meth:`stop` and when their workers are gone."""
        self.cluster.wait_for(futures, resource, self._stop, self.config.cluster.worker_wait_s,
                              what)

    def result(self, future, what: str, resource: str = GPU):
        """The result of one task, or one clear error naming the stage if it raised."""
        self.await_futures([future], what, resource)
        if future.status == "error":
            raise task_error(future.exception(), what, resource)
        return future.result()

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
        workers = self.cluster.client.scheduler_info(n_workers=-1)["workers"]
        return [self.cluster.client.submit(tasks.warm_up_task, self.config, self.store, version,
                                           workers=[address], allow_other_workers=False,
                                           pure=False, key=f"warm-up-{self._attempt}-{i}")
                for i, address in enumerate(workers)]

    # --- helpers --------------------------------------------------------------------------------
    def placed(self, stage: str) -> tuple[str, ...]:
        """The worker classes ``stage`` runs on in this run's mode (``placement``)."""
        return self.config.placed(stage, self.mode)

    def on(self, stage: str) -> str:
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
        return iteration_prompts(self.train_prompts, iteration,
                                 self.config.grpo.prompts_per_iteration, self.config.seed)

    # --- one iteration --------------------------------------------------------------------------
    def run_iteration(self, k: int, *, validate: bool, explore_next: bool) -> IterationResult:
        """Run (or finish, or just read back) iteration k: θ_k -> θ_k+1."""
        done = self.log.get(k, Stage.ITERATION)
        if done is not None:
            return IterationResult(**done.result)
        self.check_running()
        self.log.refresh()                  # one manifest read per iteration (none as writer)
        self._track_workers()
        it = self._begin(k, explore_next)   # seeds; audit and early exploration on spot
        self._rollout_and_reward(it)
        self._advantages(it)                # + τ of the selected seeds, the planner's payoff
        self._train(it)
        self._watch_fidelity(it)            # the audit's τ -> trust or fall back
        self._select_next(it)               # what exploration finished -> seeds of k+1
        it.val_reward = self.validate(k + 1, it.records) if validate else None
        return self._finish(it)

    def _begin(self, k: int, explore_next: bool) -> "IterationState":
        resumed = [s for s in (Stage.ROLLOUT, Stage.REWARD, Stage.TRAIN) if self.log.done(k, s)]
        it = IterationState(k=k, start=time.time(), prompts=self.prompts(k), resumed=resumed,
                            spotlight=mode_of(self.mode).stale,
                            explores=explore_next and mode_of(self.mode).stale)
        it.selection = self.exploration.seeds_for(k)
        if stores_prompts(self.config):
            self._embed_prompts(k, it.prompts + (self.prompts(k + 1) if it.explores else []))
        # The spot workers are idle while the rollout runs: audit the stale ranking then, and
        # (window "iteration") start exploring k+1 with θ_k, which is ready before the rollout.
        audit_done = self.log.done(k, Stage.AUDIT)
        it.audit = self.exploration.submit_audit(k) if it.spotlight and not audit_done else []
        if it.explores and explore_window(self.config, self.mode) == "iteration":
            it.plan, it.explore_futures = self.exploration.start_next(k)
        return it

    def _embed_prompts(self, k: int, prompts: list[Prompt]) -> None:
        """The prompt embeddings this iteration's workers read, into the run store first."""
        texts = [p.text for p in prompts] + [p.text for p in self.val_prompts]
        self.result(self.submit(tasks.embed_prompts_task, self.config, self.store, k, texts,
                                resource=self.on("train"), name="embed"),
                    f"prompt embeddings of iteration {k}", self.on("train"))

    def _rollout_and_reward(self, it: "IterationState") -> None:
        cfg, k = self.config, it.k
        self.emit("stage_start", iteration=k, stage="rollout")
        held = None
        if not self.log.done(k, Stage.ROLLOUT) and not self._explored_rollout(it):
            chunks = rollout_requests(cfg, tasks.RolloutRequest(k, it.prompts,
                                                                it.selection.seeds, k))
            done = self._rollout_backend().run(self, chunks)
            it.records += finish_rollout(self, chunks, it.selection.seeds, done)
            held = done.held
        # Scored where the rollout is held in memory, else read back from the run store.
        it.rollout_f = held or self.submit(tasks.load_rollout_task, cfg, self.store, k,
                                           resource=self.on("reward"), name="load-rollout")
        it.explored_rollout = bool((self.log.get(k, Stage.ROLLOUT).task or {}).get("explored"))
        score = self._explored_reward if it.explored_rollout else self._reward
        _, resumed = self.log.once(k, Stage.REWARD, lambda: score(it))
        if resumed:
            it.rewards = self._stored_rewards(k)

    def _explored_rollout(self, it: "IterationState") -> bool:
        """``objective.train_on_explored``: the selected seeds' explored samples become the
        rollout (recorded here) and their exploration rewards its rewards (written here, read
        by :meth:`_explored_reward`). False if the iteration must be rolled out."""
        cfg, k = self.config, it.k
        if not trains_on_explored(cfg, it.selection):
            return False
        request = tasks.RolloutRequest(k, it.prompts, it.selection.seeds, k)
        out = self.result(self.submit(explored_rollout_task, cfg, self.store, request,
                                      it.selection, self.log.get(k, Stage.SELECTION).source,
                                      resource=self.on("train"), name="explored-rollout"),
                          f"iteration {k}'s explored samples", self.on("train"))
        if not out["found"]:
            return False
        it.records.append(out["record"])
        self.log.record(k, Stage.ROLLOUT, RolloutResult(task=out["record"]))
        return True

    def _explored_reward(self, it: "IterationState") -> RewardResult:
        """The explored rollout's rewards: exploration's, written with it (never re-scored)."""
        it.rewards = self._stored_rewards(it.k)
        return RewardResult(mean=float(it.rewards.mean()),
                            task=self.log.get(it.k, Stage.ROLLOUT).task)

    def _stored_rewards(self, k: int) -> np.ndarray:
        """Iteration ``k``'s rewards as its reward stage wrote them to the run store."""
        return self.store.get_arrays(tasks.stage_name(k, "reward"), "reward")["rewards"]

    def _rollout_backend(self) -> RolloutBackend:
        if rollout_sp_degree(self.config) > 1:
            return SPGroupsBackend()
        return Pulled() if pulled(self.placed("rollout")) else SingleTask()

    def _reward(self, it: "IterationState") -> RewardResult:
        """Score the rollout (its data is in the store by then)."""
        cfg, k = self.config, it.k
        out = self.result(self.submit(tasks.reward_task, cfg, self.store, it.rollout_f,
                                      it.prompts, cfg.grpo.group_size, k,
                                      resource=self.on("reward"), name="reward"),
                          f"iteration {k}'s rollout and reward", self.on("reward"))
        it.rewards = out["rewards"]
        it.records.append(out["record"])
        return RewardResult(mean=float(it.rewards.mean()), task=out["record"])

    def _advantages(self, it: "IterationState") -> None:
        k = it.k
        self.emit("stage_start", iteration=k, stage="train")
        it.adv = self.result(self.submit(tasks.advantages_task, self.config, k, it.rewards, k,
                                          resource=self.on("train"), name="advantages"),
                             f"iteration {k}'s advantages", self.on("train"))
        it.records.append(it.adv["record"])
        # τ over the selected seeds: reported, never decided on (selection biases it upwards).
        if it.spotlight:
            if not it.explored_rollout:   # trained on explored: the same rewards, no second score
                it.tau = self.exploration.rank_fidelity(k, it.selection, it.rewards)
            self.exploration.record_plan_outcome(k, it.adv)
        if it.explores and explore_window(self.config, self.mode) != "iteration":
            it.plan, it.explore_futures = self.exploration.start_next(k)

    def _train(self, it: "IterationState") -> None:
        train, _ = self.log.once(it.k, Stage.TRAIN, lambda: self._train_now(it))
        it.train_info = train.stats
        it.rollout_f = None
        it.train_end = time.time()

    def _train_now(self, it: "IterationState") -> TrainResult:
        cfg, k = self.config, it.k
        self.store.checkpoints.withdraw(k + 1)   # a crash may have left one half-recorded
        request = tasks.TrainRequest(k, it.prompts, it.rewards, it.adv, k)
        if data_parallel(self):   # every gpu worker takes the step (rank 0's state is saved)
            trained = dp_train(self, request)
        else:
            trained = self.submit(tasks.train_task, cfg, self.store, it.rollout_f, request,
                                  resource=self.on("train"), name="train")
        saved = self.result(self.submit(tasks.checkpoint_task, cfg, self.store, trained, k, k,
                                        resource=self.on("train"), name="checkpoint"),
                            f"iteration {k}'s training and checkpoint", self.on("train"))
        del trained   # the weights leave the gpu worker's memory with the future
        self.store.commit_checkpoint(saved["checkpoint"])   # θ_k+1 exists from here on
        it.records += saved["records"]
        return TrainResult(stats=saved["stats"], task=saved["records"][0])

    def _watch_fidelity(self, it: "IterationState") -> None:
        """The audit's τ (random candidates, stale vs fresh) decides whether the next iteration
        may use the stale ranking: it is the unbiased sample of it."""
        k = it.k
        recorded = self.log.get(k, Stage.AUDIT)
        it.audit_tau = self.exploration.finish_audit(k, it.audit) if it.audit else \
            (recorded.kendall_tau if recorded is not None else None)
        if it.audit:
            it.records += self.store.get_json(tasks.stage_name(k, "audit"), "audit")["tasks"]
        if it.spotlight and it.audit_tau is not None:
            decision = self.exploration.observe(k, it.audit_tau)
            if decision.changed:
                self.emit("fidelity", iteration=k, decision=decision)

    def _select_next(self, it: "IterationState") -> None:
        if not it.explore_futures:
            return
        k, plan, waiting = it.k, it.plan, time.time()
        if not self.config.exploration.deadline or "train" in it.resumed:
            # No training window to hide in after a resume; deadline off = every request.
            self.exploration.wait_all(it.explore_futures)
        self.emit("stage_start", iteration=k, stage="select")
        it.planned = plan.prompts * plan.candidates
        nxt = self.exploration.finish(k + 1, it.explore_futures, "explore", planned=it.planned,
                                      select=self.exploration.trusting)
        it.explore_wait_s = time.time() - waiting
        found = self.exploration.candidates(k + 1, "explore")
        it.explored = sum(len(row) for row in found["seeds"])
        it.filled = int(nxt.filled.sum()) if nxt is not None else 0
        it.records += found["tasks"]
        it.preemptions += self.log.get(k + 1, Stage.EXPLORE).preemptions
        if plan.budget_s is not None:
            ends = [t["end"] for t in it.records if t["stage"] == "explore"]
            it.overrun = bool(ends) and max(ends) > it.train_end

    def _finish(self, it: "IterationState") -> IterationResult:
        """Record the iteration: rewards table, tasks, planning state, events, its result."""
        k = it.k
        self._append_rewards(k, it.prompts, it.selection, it.rewards, it.adv, it.tau,
                             it.audit_tau)
        self._track_workers()
        end = time.time()
        result = it.result(self.mode, end, self.ledger.cost(it.start, end, self.prices)["total"],
                           self.ledger.total(end, self.prices)["total"],
                           self.exploration.monitor.state)
        self.store.put_json(tasks.stage_name(k, "iteration"), "tasks",
                            {"tasks": it.records, "train_end": it.train_end})
        self.store.put_json(tasks.stage_name(k, "iteration"), "planning",
                            self.exploration.state())
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
        out = self.result(self.submit(tasks.validation_task, self.config, self.store, version,
                                       self.val_prompts, version, resource=self.on("train"),
                                       name="validation"), f"validation of weights {version}",
                          self.on("train"))
        self.last_validation = out
        self.first_validation = self.first_validation or out
        grid = grid_of(version, out["images"], out["rewards"], validation_labels(self.val_prompts, out["rewards"]),
                       out["mean_reward"])
        save_grid(self.store, grid)   # once per version: inside the stage log's ``once``
        self.emit("validation_done", iteration=max(version - 1, 0), version=version, grid=grid)
        if records is not None:
            records.append(out["record"])
        return ValidationResult(float(out["mean_reward"]), version, out["record"])

    def _append_rewards(self, k: int, prompts: list[Prompt], selection: Selection,
                        rewards: np.ndarray, adv: dict, tau: float | None,
                        audit_tau: float | None) -> None:
        """One table row per scored sample of iteration k: its rollout and the explored candidates."""
        cols: dict[str, list] = {"prompt": [], "seed": [], "stage": [], "reward": [],
                                 "weights_version": [], "advantage": [], "selected": [],
                                 "kendall_tau": []}
        nan = float("nan")

        def add(prompt, seed, stage, reward, version, advantage, selected, tau=nan):
            for key, value in zip(cols, (prompt, seed, stage, reward, version, advantage, selected,
                                         tau)):
                cols[key].append(value)

        for p, prompt in enumerate(prompts):
            for g, seed in enumerate(selection.seeds[p]):
                add(prompt.text, int(seed), "rollout", float(rewards[p, g]), k,
                    float(adv["values"][p, g]), 1.0, nan if tau is None else tau)
        if self.log.done(k, Stage.AUDIT):
            audit = self.store.get_json(tasks.stage_name(k, "audit"), "audit")
            for p, seeds, fresh in zip(audit["prompt_index"], audit["seeds"], audit["fresh"]):
                for seed, reward in zip(seeds, fresh):
                    add(prompts[p].text, int(seed), "audit", float(reward), k, nan, nan,
                        nan if audit_tau is None else audit_tau)
        for stage in ("explore", "explore-sync"):
            if self.log.done(k, stage):
                found = self.exploration.candidates(k, stage)
                version = k - 1 if stage == "explore" else k
                chosen = [set(int(s) for s in row) for row in selection.seeds]
                for p, (seeds, rews) in enumerate(zip(found["seeds"], found["rewards"])):
                    for seed, reward in zip(seeds, rews):
                        add(prompts[p].text, int(seed), stage, float(reward), version, float("nan"),
                            float(int(seed) in chosen[p]))
        self.store.append_rewards(k, cols)


def _prices(config: RunConfig) -> dict[str, float]:

    return worker_class_prices(config.cost, load_prices(config.cost.prices))
