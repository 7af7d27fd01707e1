"""Seed exploration of one run, as a collaborator of the driver: plan it, run it, select from
it, and watch whether stale weights still rank seeds.

The driver holds one :class:`Exploration` and calls it at fixed points of an iteration:
``seeds_for(k)`` (the seeds to roll out), ``start_next(k)`` (plan and start exploring k+1 with
θ_k on spot workers), ``submit_audit(k)`` / ``finish_audit(k)`` (stale against fresh ranking),
``observe(k, tau)`` (the fallback decision), ``finish_next(k)`` (what exploration finished ->
the seeds of k+1), and ``state()`` (what a resumed run restores). What it needs from the driver
is the small :class:`RunContext` interface.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import numpy as np

from pipelines.run import tasks
from pipelines.cluster import GPU, Absence, task_error
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.run.context import RunContext
from pipelines.run.rollout import newcomer_warm_up, pulled
from pipelines.run.stages import (AuditResult, ExploreResult, PlanResult, SelectionResult,
                                  Stage)
from pipelines.run.streamed import Explored
from spotlight.config import RunConfig
from spotlight.exploration import Selection, core
from spotlight.exploration.selection import random_group_std, seed_source
from spotlight.exploration.fidelity import (FidelityDecision, RankFidelityMonitor, audit_due,
                                            grouped_kendall_tau)
from spotlight.exploration.planner import ExplorationPlanner, Plan, exploration_window_s
from spotlight.models.prompts import Prompt
from spotlight.modes import SPOTLIGHT, SYNC, mode_of


def explore_window(config: RunConfig, mode: str | None = None) -> str:
    """When stale exploration may run: ``exploration.window``, but only while the gpu workers
    train when its workers also pull the rollout (they are busy with it until then)."""
    rollout = config.placed("rollout", mode)
    shared = set(rollout) & set(config.placed("explore", SPOTLIGHT))
    return "train" if pulled(rollout) and shared else config.exploration.window


def explore_requests(config: RunConfig, iteration: int, prompts: list[Prompt], version: int,
                     stage: str, candidates: int,
                     steps: int | None = None) -> list[tasks.ExploreRequest]:
    """The requests exploring ``prompts`` of ``iteration`` with weights ``version``: one per
    prompt and ``exploration.request_batch`` candidates (fixed shapes, wherever they run)."""
    seeds = core.candidate_seeds(config.seed, iteration, len(prompts), candidates)
    batch = config.exploration.request_batch
    return [tasks.ExploreRequest(iteration, p, prompt, seeds[p, lo:lo + batch], chunk, version,
                                 stage, steps)
            for p, prompt in enumerate(prompts)
            for chunk, lo in core.request_chunks(candidates, batch)]


def scored(out: Explored) -> core.Scored:
    """An exploration task's output as the core reads it."""
    return core.Scored(out.prompt_index, out.chunk, out.seeds, out.rewards)


def per_prompt_of(candidates: dict) -> core.PerPrompt:
    """The candidates of a stage's ``candidates.json``, per prompt."""
    return list(zip(candidates["seeds"], candidates["rewards"]))


class Exploration:
    """Plans, runs and judges seed exploration; owns the planner and the fidelity monitor."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.planner, self.monitor = self._restored_planning()
        # (iteration, stage) -> its candidates.json, as written or first read: an iteration's
        # stages ask for them about six times. A few recent iterations are kept.
        self._candidates: dict[tuple[int, str], dict] = {}

    @property
    def config(self) -> RunConfig:
        return self.run.config

    @property
    def trusting(self) -> bool:
        """Whether the stale ranking is trusted (the fidelity monitor is not in fallback)."""
        return self.monitor.state != "fallback"

    def state(self) -> dict:
        """Planner and monitor, as a resumed run restores them."""
        return {"planner": self.planner.to_dict(), "monitor": self.monitor.to_dict()}

    def _restored_planning(self) -> tuple[ExplorationPlanner, RankFidelityMonitor]:
        """Planner and fidelity monitor as the last recorded iteration left them."""
        cfg, log = self.config, self.run.log
        k = log.completed_iterations()
        if k == 0:
            return ExplorationPlanner(cfg.planner, cfg.sampler), RankFidelityMonitor(cfg.fidelity)
        record = log.get(k - 1, Stage.ITERATION)
        # Runs recorded before the planning state left the manifest keep it in the record.
        state = {"planner": record.planner, "monitor": record.monitor} \
            if record.planner is not None else \
            self.run.store.get_json(tasks.stage_name(k - 1, "iteration"), "planning")
        return (ExplorationPlanner.from_dict(cfg.planner, state["planner"], cfg.sampler),
                RankFidelityMonitor.from_dict(cfg.fidelity, state["monitor"]))

    # --- running requests -------------------------------------------------------------------
    def explore_spec(self, request: tasks.ExploreRequest) -> RequestSpec:
        """The dispatch entry of one exploration or audit request."""
        return RequestSpec(request.name, tasks.explore_task,
                           (self.config, self.run.store, request),
                           tasks.stage_name(request.iteration, request.stage), request.name,
                           numbered=True)

    def classes(self, stale: bool) -> tuple[str, ...]:
        """Where stale (spotlight) or synchronous exploration runs (``placement.explore``)."""
        return self.config.placed("explore", SPOTLIGHT if stale else SYNC)

    def dispatch(self, requests: list[RequestSpec], classes: tuple[str, ...], stage: str):
        """Start ``requests``: pulled by the workers of ``classes`` (a :class:`RequestPool`)
        when spot workers or several classes take part, else (and with ``preemption.dispatch:
        push``) submitted at once as futures."""
        run = self.run
        if pulled(classes) and self.config.preemption.dispatch == "pull":
            version = requests[0].args[2].version if requests else 0
            return RequestPool(run.cluster, requests, self.config.preemption, store=run.store,
                               resource=classes, watch_progress=self.config.stream_latents,
                               cut_off=run.standing.cut_off,
                               on_event=lambda kind, info: run.emit(kind, stage=stage, **info),
                               warm_up=newcomer_warm_up(run.cluster.client, self.config,
                                                        run.store, version))
        numbered = {"attempt": (run.store.epoch, 1)}   # pushed once: the driver's one attempt
        return [run.submit(spec.fn, *spec.args, **(numbered if spec.numbered else {}),
                           resource=classes[0], name=stage) for spec in requests]

    def wait_all(self, work, what: str = "exploration", resource: str | None = None) -> None:
        """Wait for every request of ``work``; stops with the run (:meth:`Driver.stop`)."""
        if not isinstance(work, RequestPool):
            self.run.await_futures(work, what, resource or self.classes(True)[0])
            return
        # Spot requests wait for spot workers (the pool gives up after no_spot_wait_s); with
        # no gpu worker left, though, the run cannot go on whatever spot does.
        gpu = Absence(self.run.cluster, self.config.placed("train")[0],
                      self.config.cluster.worker_wait_s, what)
        while not work.wait(0.5):
            try:
                self.run.check_running()
                gpu.check()
            except BaseException:
                work.close()
                raise

    def collect(self, work, stage: str) -> tuple[list, int, dict | None]:
        """Stop ``work``: the outputs of its finished requests (in request order), how many
        were cancelled, and the dispatch log (pull dispatch only)."""
        if isinstance(work, RequestPool):
            return self._collect_pool(work, stage)
        from distributed import Future

        failed = [f for f in work if isinstance(f, Future) and f.status == "error"]
        if failed:   # an exploration bug is an error, not an unfinished candidate
            raise task_error(failed[0].exception(), f"{stage} request", GPU)
        # One batched fetch: a .result() per future is a round trip each, on the critical path.
        finished = self.run.cluster.client.gather([f for f in work if f.status == "finished"])
        pending = [f for f in work if f.status != "finished"]
        if pending:
            self.run.cluster.client.cancel(pending)
        return finished, len(pending), None

    def _collect_pool(self, pool: RequestPool, stage: str) -> tuple[list, int, dict]:
        results = pool.close()
        summary = pool.summary()
        for move in pool.log:   # every assignment, loss, requeue and hand-back, timed
            self.run.record_event("request", {"stage": stage, "what": move["kind"],
                                              **{k: v for k, v in move.items() if k != "kind"}})
        if summary["preemptions_hard"] or summary["preemptions_graceful"] or summary["gave_up"]:
            self.run.emit("preemptions", stage=stage, summary=summary)
        return ([results[name] for name in sorted(results)],
                summary["requests"] - summary["finished"],
                {"summary": summary, "log": pool.log, "events": pool.events})

    # --- exploring and selecting ----------------------------------------------------------------
    def submit(self, iteration: int, version: int, stale: bool, candidates: int | None = None,
               steps: int | None = None, prompts_explored: int | None = None):
        """Explore the (first ``prompts_explored``) prompts of ``iteration`` with weights
        ``version`` (``stale``: θ_k-1, off the critical path; else synchronously), one request
        per prompt and chunk of candidates."""
        prompts = self.run.prompts(iteration)[:prompts_explored]
        stage = "explore" if stale else "explore-sync"
        requests = explore_requests(self.config, iteration, prompts, version, stage,
                                    candidates or self.config.exploration.candidates, steps)
        return self.dispatch([self.explore_spec(r) for r in requests], self.classes(stale),
                             stage)

    def finish(self, iteration: int, work, stage: str, planned: int | None = None,
               select: bool = True) -> Selection | None:
        """Collect finished exploration requests and record them; select seeds for ``iteration``."""
        finished, cancelled, dispatch = self.collect(work, stage)
        prompts = self.run.prompts(iteration)
        per_prompt = core.gather([scored(out) for out in finished], len(prompts))
        found = {"seeds": [s for s, _ in per_prompt], "rewards": [r for _, r in per_prompt],
                 "tasks": [o.record for o in finished], "dispatch": dispatch}
        self.run.store.put_json(tasks.stage_name(iteration, stage), "candidates", found)
        self._remember(iteration, stage, found)
        summary = (dispatch or {}).get("summary", {})
        planned = planned if planned is not None else \
            len(prompts) * self.config.exploration.candidates
        self.run.log.record(iteration, stage, ExploreResult(
            explored=sum(len(s) for s, _ in per_prompt), planned=planned,
            requests_finished=len(finished), requests_cancelled=cancelled,
            preemptions=summary.get("preemptions_hard", 0) +
            summary.get("preemptions_graceful", 0)))
        return self._select(iteration, per_prompt, stage) if select else None

    def _select(self, iteration: int, per_prompt: core.PerPrompt | None,
                source: str) -> Selection:
        """The seeds of ``iteration`` from ``source`` (the core decides), recorded."""
        cfg = self.config
        selection = core.selection_of("sync" if source == "explore-sync" else source, cfg.seed,
                                      iteration, cfg.grpo.prompts_per_iteration,
                                      cfg.grpo.group_size, per_prompt)
        return self._record_selection(iteration, selection, source)

    def _record_selection(self, iteration: int, selection: Selection, source: str) -> Selection:
        """The seeds go to the run store and only their source to the manifest: every stage
        record rewrites the whole manifest, so what grows with the run stays out of it."""
        self.run.store.put_json(tasks.stage_name(iteration, "selection"), "selection",
                                selection.to_record())
        self.run.log.record(iteration, Stage.SELECTION, SelectionResult(source))
        return selection

    def stale_candidates(self, iteration: int) -> dict | None:
        """The candidates explored for ``iteration`` with stale weights, or None."""
        if not self.run.log.done(iteration, Stage.EXPLORE):
            return None
        return self.candidates(iteration, "explore")

    def candidates(self, iteration: int, stage: str) -> dict:
        """``candidates.json`` of a recorded exploration stage (``explore``, ``explore-sync``)."""
        found = self._candidates.get((iteration, stage))
        if found is None:
            found = self.run.store.get_json(tasks.stage_name(iteration, stage), "candidates")
            self._remember(iteration, stage, found)
        return found

    def _remember(self, iteration: int, stage: str, found: dict) -> None:
        self._candidates[(iteration, stage)] = found
        for key in [key for key in self._candidates if key[0] < iteration - 4]:
            del self._candidates[key]

    def seeds_for(self, iteration: int) -> Selection:
        """The seeds of ``iteration``: recorded, explored synchronously now, or random.

        In spotlight mode with the fidelity monitor in fallback, the stale candidates are kept
        for measuring τ but the seeds come from the fallback (fresh exploration or random).
        """
        run, cfg = self.run, self.config
        record = run.log.get(iteration, Stage.SELECTION)
        if record is not None:
            return Selection.from_record(record.selection or run.store.get_json(
                tasks.stage_name(iteration, "selection"), "selection"))
        # Whether stale candidates exist is in the stage log; they are read only where used.
        explored = mode_of(run.mode).stale and run.log.done(iteration, Stage.EXPLORE)
        source = seed_source(run.mode, self.trusting, cfg.fidelity.fallback, explored)
        if source == "sync":
            return self._explore_now(iteration)
        # explore: explored, not yet selected (a resumed driver); fallback-random: the first G
        stale = self.stale_candidates(iteration) if explored else None
        return self._select(iteration, per_prompt_of(stale) if stale else None, source)

    def _explore_now(self, iteration: int) -> Selection:
        """Synchronous exploration with the current weights on gpu workers (sync, fallback)."""
        self.run.emit("stage_start", iteration=iteration, stage="explore-sync")
        candidates = self.config.exploration.candidates
        work = self.submit(iteration, iteration, False, candidates)
        self.wait_all(work, f"iteration {iteration}'s synchronous exploration",
                      self.classes(False)[0])
        return self.finish(iteration, work, "explore-sync",
                           planned=len(self.run.prompts(iteration)) * candidates)

    def start_next(self, k: int) -> tuple[Plan, Any]:
        """Plan the exploration of k+1 and start it on the spot workers with θ_k."""
        plan = self.plan(k + 1)
        if self.run.log.done(k + 1, Stage.EXPLORE) or not plan.candidates:
            return plan, []
        return plan, self.submit(k + 1, k, True, plan.candidates, plan.steps, plan.prompts)

    # --- planning -------------------------------------------------------------------------------
    def plan(self, iteration: int) -> Plan:
        """The planner's (N, M) for exploring ``iteration``; recorded, and reused on resume."""
        record = self.run.log.get(iteration, Stage.PLAN)
        if record is not None:
            return record.as_plan
        cfg = self.config
        rollout_steps = cfg.exploration.steps or cfg.sampler.num_steps
        prompts = len(self.run.prompts(iteration))
        if cfg.planner.enabled:
            present = self.run.cluster.workers_by_class()
            slots = sum(len(present.get(c, ())) for c in self.classes(True)) * \
                cfg.cluster.threads_per_worker
            plan = self.planner.plan(iteration, prompts, cfg.grpo.group_size, slots,
                                     self._window_history(iteration - 1),
                                     self._seconds_per_sample_step(iteration - 1), rollout_steps,
                                     self._replaced_rollout_s(iteration - 1))
        else:
            plan = Plan(iteration, cfg.exploration.candidates, rollout_steps, prompts, None, None,
                        None, "fixed: planner off")
            self.planner.events.append({"kind": "plan", **asdict(plan)})
        self.run.log.record(iteration, Stage.PLAN, PlanResult.of(plan, time.time()))
        if cfg.planner.enabled:
            self.run.emit("plan", iteration=iteration, plan=plan)
        return plan

    def _window_history(self, before: int, last: int | None = None) -> list[float]:
        """Measured exploration windows of the ``last`` iterations before ``before`` (default:
        the planner's ``train_time_window``); unmeasured ones (resumed stages) are left out."""
        out = []
        for k in range(max(0, before - (last or self.config.planner.train_time_window)), before):
            seconds = exploration_window_s(self._recorded_task(k, Stage.ROLLOUT),
                                           self._recorded_task(k, Stage.TRAIN),
                                           explore_window(self.config, self.run.mode))
            if seconds is not None:
                out.append(seconds)
        return out

    def _replaced_rollout_s(self, before: int) -> float | None:
        """Under ``objective.train_on_explored``: the newest measured rollout that was sampled
        (not the explored samples) before iteration ``before`` -- what exploring every prompt
        saves; else None."""
        if not self.config.objective.train_on_explored:
            return None
        for k in range(before - 1, -1, -1):
            task = self._recorded_task(k, Stage.ROLLOUT)
            if task and "start" in task and not task.get("explored"):
                return task["end"] - task["start"]
        return None

    def _recorded_task(self, k: int, stage: str) -> dict | None:
        """The task record of iteration ``k``'s ``stage`` in the stage log (None if unrecorded)."""
        record = self.run.log.get(k, stage)
        return None if record is None else record.task

    def _seconds_per_sample_step(self, before: int) -> float | None:
        """Measured spot-seconds per sample per denoising step, from the newest exploration."""
        for k in range(before, max(0, before - 5), -1):
            stale = self.stale_candidates(k)
            if stale and stale["tasks"]:
                work = sum(t.get("samples", 0) * t.get("steps", 0) for t in stale["tasks"])
                busy = sum(t["end"] - t["start"] for t in stale["tasks"])
                if work:
                    return busy / work
        return None

    def record_plan_outcome(self, k: int, adv: dict) -> None:
        """Pay the planner for the plan that explored iteration k: the spread GRPO saw."""
        record, stale = self.run.log.get(k, Stage.PLAN), self.stale_candidates(k)
        if record is None or stale is None or not stale["tasks"]:
            return
        group = self.config.grpo.group_size
        random_std = random_group_std(stale["rewards"], group)
        actual = sum(t["end"] - t["start"] for t in stale["tasks"])
        plan = record.as_plan
        window = self._window_history(k, last=1)   # iteration k-1's: it explored k
        billed = window[0] * plan.slots if window and plan.slots else None
        self.planner.record(plan, actual, float(np.mean(adv["group_std"])), random_std, billed)

    # --- rank fidelity --------------------------------------------------------------------------
    def rank_fidelity(self, k: int, selection: Selection, rewards: np.ndarray) -> float | None:
        """Kendall τ between the stale exploration rewards (θ_k-1) of the seeds iteration k
        rolled out and their rollout rewards (θ_k), within each prompt; None without data.
        Reported only: selection keeps each prompt's extremes, which biases it upwards."""
        stale = self.stale_candidates(k)
        if stale is None:
            return None
        xs, ys = [], []
        for p, row in enumerate(selection.seeds):
            scored = dict(zip(stale["seeds"][p], stale["rewards"][p]))
            pairs = [(scored[int(s)], rewards[p, g]) for g, s in enumerate(row) if int(s) in scored]
            if len(pairs) >= 2:
                xs.append([a for a, _ in pairs])
                ys.append([b for _, b in pairs])
        tau = grouped_kendall_tau(xs, ys) if xs else float("nan")
        return None if np.isnan(tau) else float(tau)

    def submit_audit(self, k: int):
        """Re-score a random subset of iteration k's stale candidates with fresh weights θ_k."""
        stale = self.stale_candidates(k)
        fidelity = self.config.fidelity
        if stale is None or not audit_due(k, fidelity.audit_every):
            return []
        picks = core.audit_candidates(self.config.seed, k, per_prompt_of(stale),
                                      fidelity.audit_prompts, fidelity.audit_candidates)
        prompts = self.run.prompts(k)
        plan = self.run.log.get(k, Stage.PLAN)
        steps = core.audit_steps(plan.as_plan if plan is not None else None)
        requests = [self.explore_spec(tasks.ExploreRequest(k, p, prompts[p], seeds, 0, k,
                                                           "audit", steps))
                    for p, seeds in picks]
        return self.dispatch(requests, self.classes(True), "audit") if requests else []

    def finish_audit(self, k: int, work) -> float | None:
        """The audit's τ (recorded), or None when no spot worker ran it."""
        if not work:
            return None
        self.wait_all(work)
        outs, _, _ = self.collect(work, "audit")
        if not outs:
            return None   # no spot worker ran it (the pool said why)
        audit = core.audit_tau(per_prompt_of(self.stale_candidates(k)),
                               [scored(out) for out in outs])
        self.run.store.put_json(tasks.stage_name(k, "audit"), "audit", {
            "seeds": [o.seeds.tolist() for o in outs],
            "prompt_index": [o.prompt_index for o in outs],
            "stale": audit.stale, "fresh": audit.fresh, "kendall_tau": audit.kendall_tau,
            "tasks": [o.record for o in outs]})
        self.run.log.record(k, Stage.AUDIT, AuditResult(audit.kendall_tau))
        return audit.kendall_tau

    def observe(self, k: int, audit_tau: float) -> FidelityDecision:
        """Feed the monitor one audit τ: it decides whether the stale ranking is trusted."""
        return self.monitor.observe(k, audit_tau)
