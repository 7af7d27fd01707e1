"""The driver's exploration bookkeeping: plans, rank fidelity and audits of one run.

A mixin of :class:`pipelines.driver.Driver` (it uses the driver's store, cluster, config,
planner and monitor): everything here decides or measures *how much* to explore and *whether
the stale ranking can be trusted*, apart from the iteration graph itself.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

from pipelines import worker as tasks
from pipelines.cluster import GPU, SPOT, Absence, task_error
from pipelines.dispatch import RequestPool, RequestSpec
from spotlight.exploration import Selection
from spotlight.exploration.fidelity import audit_due, audit_picks, grouped_kendall_tau
from spotlight.exploration.planner import Plan, exploration_window_s
from storage.manifest import stage_key


class ExplorationBook:
    """Plans, τ and audits; mixed into the driver."""

    # --- running requests -------------------------------------------------------------------
    def explore_spec(self, request: "tasks.ExploreRequest") -> RequestSpec:
        """The dispatch entry of one exploration or audit request."""
        return RequestSpec(request.name, tasks.explore_task, (self.config, self.store, request),
                           tasks.stage_name(request.iteration, request.stage), request.name)

    def dispatch(self, requests: list[RequestSpec], resource: str, stage: str):
        """Start ``requests``: pulled by spot workers (a :class:`RequestPool`), or, on gpu
        workers and with ``preemption.dispatch: push``, submitted at once as futures."""
        if resource == SPOT and self.config.preemption.dispatch == "pull":
            return RequestPool(self.cluster, requests, self.config.preemption, store=self.store,
                               on_event=lambda kind, info: self._emit(kind, stage=stage, **info))
        return [self._submit(spec.fn, *spec.args, resource=resource, name=stage)
                for spec in requests]

    def wait_all(self, work, what: str = "exploration", resource: str = SPOT) -> None:
        """Wait for every request of ``work``; stops with the run (:meth:`Driver.stop`)."""
        if isinstance(work, RequestPool):
            # Spot requests wait for spot workers (the pool gives up after no_spot_wait_s);
            # with no gpu worker left, though, the run cannot go on whatever spot does.
            gpu = Absence(self.cluster, GPU, self.config.cluster.worker_wait_s, what)
            while not work.wait(0.5):
                try:
                    self.check_running()
                    gpu.check()
                except BaseException:
                    work.close()
                    raise
        else:
            self._await(work, what, resource)

    def collect(self, work, stage: str) -> tuple[list[dict], int, dict | None]:
        """Stop ``work``: the outputs of its finished requests (in request order), how many
        were cancelled, and the dispatch log (pull dispatch only)."""
        if isinstance(work, RequestPool):
            results = work.close()
            summary = work.summary()
            for move in work.log:   # every assignment, loss, requeue and hand-back, timed
                self._record_event("request", {"stage": stage, "what": move["kind"],
                                               **{k: v for k, v in move.items() if k != "kind"}})
            if summary["preemptions_hard"] or summary["preemptions_graceful"] or summary["gave_up"]:
                self._emit("preemptions", stage=stage, summary=summary)
            return ([results[name] for name in sorted(results)],
                    summary["requests"] - summary["finished"], {"summary": summary,
                                                                "log": work.log})
        from distributed import Future

        failed = [f for f in work if isinstance(f, Future) and f.status == "error"]
        if failed:
            # an exploration bug is an error, not an unfinished candidate
            raise task_error(failed[0].exception(), f"{stage} request", GPU)
        # One batched fetch: a .result() per future is a round trip each, on the critical path.
        finished = self.cluster.client.gather([f for f in work if f.status == "finished"])
        pending = [f for f in work if f.status != "finished"]
        if pending:
            self.cluster.client.cancel(pending)
        return finished, len(pending), None

    def plan_exploration(self, iteration: int) -> Plan:
        """The planner's (N, M) for exploring ``iteration``; recorded, and reused on resume."""
        record = self._done(iteration, "plan")
        if record is not None:
            return Plan(**record["plan"])
        cfg = self.config
        rollout_steps = cfg.exploration.steps or cfg.sampler.num_steps
        if cfg.planner.enabled:
            slots = len(self.cluster.workers_by_class()[SPOT]) * cfg.cluster.threads_per_worker
            plan = self.planner.plan(iteration, len(self.prompts(iteration)), cfg.grpo.group_size,
                                     slots, self._window_history(iteration - 1),
                                     self._seconds_per_sample_step(iteration - 1), rollout_steps)
        else:
            plan = Plan(iteration, cfg.exploration.candidates, rollout_steps,
                        len(self.prompts(iteration)), None, None, None, "fixed: planner off")
            self.planner.events.append({"kind": "plan", **asdict(plan)})
        self._mark(iteration, "plan", {"plan": asdict(plan), "planned_at": time.time()})
        if cfg.planner.enabled:
            self._emit("plan", iteration=iteration, plan=plan)
        return plan

    def _window_history(self, before: int, last: int | None = None) -> list[float]:
        """Measured exploration windows of the ``last`` iterations before ``before`` (default:
        the planner's ``train_time_window``); unmeasured ones (resumed stages) are left out."""
        stages = self.store.manifest.stages()   # one manifest read for every record below

        def task(k: int, stage: str) -> dict | None:
            record = stages.get(stage_key(tasks.stage_name(k, stage))) or {}
            return record.get("info", {}).get("task")

        out = []
        for k in range(max(0, before - (last or self.config.planner.train_time_window)), before):
            seconds = exploration_window_s(task(k, "rollout"), task(k, "train"),
                                           self.config.exploration.window)
            if seconds is not None:
                out.append(seconds)
        return out

    def _seconds_per_sample_step(self, before: int) -> float | None:
        """Measured spot-seconds per sample per denoising step, from the newest exploration."""
        for k in range(before, max(0, before - 5), -1):
            stale = self._stale_candidates(k)
            if stale and stale["tasks"]:
                work = sum(t.get("samples", 0) * t.get("steps", 0) for t in stale["tasks"])
                busy = sum(t["end"] - t["start"] for t in stale["tasks"])
                if work:
                    return busy / work
        return None

    def rank_fidelity(self, k: int, selection: Selection, rewards: np.ndarray) -> float | None:
        """Kendall τ between the stale exploration rewards (θ_k-1) of the seeds iteration k
        rolled out and their rollout rewards (θ_k), within each prompt; None without data."""
        stale = self._stale_candidates(k)
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

    def submit_audit(self, k: int) -> list:
        """Re-score a random subset of iteration k's stale candidates with fresh weights θ_k."""
        stale = self._stale_candidates(k)
        fidelity = self.config.fidelity
        if stale is None or not audit_due(k, fidelity.audit_every):
            return []
        picks = audit_picks(self.config.seed, k, [len(s) for s in stale["seeds"]],
                            fidelity.audit_prompts, fidelity.audit_candidates)
        prompts = self.prompts(k)
        # The same replay steps as the stale exploration, so the audit isolates staleness.
        plan = self._done(k, "plan")
        steps = plan["plan"]["steps"] if plan is not None else None
        requests = [self.explore_spec(tasks.ExploreRequest(
                        k, p, prompts[p], np.asarray([stale["seeds"][p][c] for c in cs]), 0, k,
                        "audit", steps))
                    for p, cs in picks]
        return self.dispatch(requests, SPOT, "audit") if requests else []

    def finish_audit(self, k: int, work) -> float | None:
        if not work:
            return None
        self.wait_all(work)
        outs, _, _ = self.collect(work, "audit")
        if not outs:
            return None   # no spot worker ran it (the pool said why)
        stale = self._stale_candidates(k)
        xs, ys = [], []
        for out in outs:
            scored = dict(zip(stale["seeds"][out["prompt_index"]], stale["rewards"][out["prompt_index"]]))
            xs.append([scored[int(s)] for s in out["seeds"]])
            ys.append(out["rewards"].tolist())
        tau = grouped_kendall_tau(xs, ys)
        self.store.put_json(tasks.stage_name(k, "audit"), "audit", {
            "seeds": [o["seeds"].tolist() for o in outs], "prompt_index": [o["prompt_index"] for o in outs],
            "stale": xs, "fresh": ys, "kendall_tau": None if np.isnan(tau) else tau,
            "tasks": [o["record"] for o in outs]})
        self._mark(k, "audit", {"kendall_tau": None if np.isnan(tau) else tau})
        return None if np.isnan(tau) else float(tau)


    def _record_plan_outcome(self, k: int, adv: dict) -> None:
        """Pay the planner for the plan that explored iteration k: the spread GRPO saw."""
        record, stale = self._done(k, "plan"), self._stale_candidates(k)
        if record is None or stale is None or not stale["tasks"]:
            return
        group = self.config.grpo.group_size
        random_std = float(np.mean([np.std(r[:group]) for r in stale["rewards"] if len(r) >= 2]
                                   or [0.0]))
        actual = sum(t["end"] - t["start"] for t in stale["tasks"])
        plan = Plan(**record["plan"])
        window = self._window_history(k, last=1)   # iteration k-1's: it explored k
        billed = window[0] * plan.slots if window and plan.slots else None
        self.planner.record(plan, actual, float(np.mean(adv["group_std"])), random_std, billed)

