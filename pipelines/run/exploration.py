"""Seed exploration on the cluster: the requests of an exploration or audit, dispatched to the
workers of its placement, waited for and collected; and the seconds the planner plans with, as
this run measured them (:class:`MeasuredTime`).

What to explore, select and trust is decided by the iteration program
(:mod:`spotlight.iteration.program`); the driver answers its exploration requests with
:class:`Exploration`. What it needs from the driver is the small :class:`RunContext` interface.
"""
from __future__ import annotations

import time

from pipelines.cluster import GPU, Absence, task_error
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.run import recording, tasks
from pipelines.run.context import RunContext
from pipelines.run.rollout import newcomer_warm_up
from pipelines.run.stages import Stage
from spotlight.config import RunConfig
from spotlight.exploration import core
from spotlight.exploration.planner import Plan, exploration_window_s
from spotlight.iteration import PlanningInputs, explore_window, pulled, requests
from spotlight.models.prompts import Prompt
from spotlight.modes import SPOTLIGHT, SYNC


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


class Exploration:
    """Runs exploration and audit requests on the cluster; keeps recent candidates in memory."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        # (iteration, stage) -> its candidates.json, as written or first read: an iteration
        # asks for them several times. A few recent iterations are kept.
        self._candidates: dict[tuple[int, str], dict] = {}

    @property
    def config(self) -> RunConfig:
        return self.run.config

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

    def dispatch(self, specs: list[RequestSpec], classes: tuple[str, ...], stage: str):
        """Start ``specs``: pulled by the workers of ``classes`` (a :class:`RequestPool`) when
        spot workers or several classes take part, else submitted at once as futures."""
        run = self.run
        if pulled(classes):
            version = specs[0].args[2].version if specs else 0
            return RequestPool(run.cluster, specs, self.config.preemption, store=run.store,
                               resource=classes, watch_progress=self.config.stream_latents,
                               cut_off=run.carried.cut_off,
                               on_event=lambda kind, info: run.emit(kind, stage=stage, **info),
                               warm_up=newcomer_warm_up(run.cluster.client, self.config,
                                                        run.store, version))
        numbered = {"attempt": (run.store.epoch, 1)}   # pushed once: the driver's one attempt
        return [run.submit(spec.fn, *spec.args, **(numbered if spec.numbered else {}),
                           resource=classes[0], name=stage) for spec in specs]

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
        finished = self.run.fetch([f for f in work if f.status == "finished"], f"{stage} request",
                                  self.classes(True)[0])
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

    # --- the program's exploration requests ------------------------------------------------
    def start(self, request: requests.StartExploration):
        """Dispatch the requests of one exploration (stale on spot, or synchronous)."""
        stale = request.stage == "explore"
        specs = [self.explore_spec(r) for r in explore_requests(
            self.config, request.iteration, request.prompts, request.version, request.stage,
            request.candidates, request.steps)]
        return self.dispatch(specs, self.classes(stale), request.stage)

    def finish(self, request: requests.FinishExploration) -> dict:
        """Wait (all, or what finished by now), collect, store and record an exploration."""
        stale = request.stage == "explore"
        if request.wait_all:
            what = "exploration" if stale else \
                f"iteration {request.iteration}'s synchronous exploration"
            self.wait_all(request.work, what, self.classes(stale)[0])
        finished, cancelled, dispatch = self.collect(request.work, request.stage)
        found = recording.store_candidates(self.run.store, self.run.log, request.iteration,
                                           request.stage, self.config.grpo.prompts_per_iteration,
                                           finished, cancelled, request.planned, dispatch)
        self._remember(request.iteration, request.stage, found)
        return found

    def start_audit(self, request: requests.StartAudit):
        specs = [self.explore_spec(tasks.ExploreRequest(request.iteration, p, prompt, seeds, 0,
                                                        request.iteration, "audit",
                                                        request.steps))
                 for p, prompt, seeds in request.picks]
        return self.dispatch(specs, self.classes(True), "audit")

    def finish_audit(self, work) -> list | None:
        """The audit's outputs, or None when no spot worker ran it (the pool said why)."""
        self.wait_all(work)
        outs, _, _ = self.collect(work, "audit")
        return outs or None

    def candidates(self, iteration: int, stage: str) -> dict:
        """``candidates.json`` of a recorded exploration stage (``explore``, ``explore-sync``)."""
        found = self._candidates.get((iteration, stage))
        if found is None:
            found = recording.read_candidates(self.run.store, iteration, stage)[1]
            self._remember(iteration, stage, found)
        return found

    def stale_candidates(self, iteration: int) -> dict | None:
        """The candidates explored for ``iteration`` with stale weights, or None."""
        if not self.run.log.done(iteration, Stage.EXPLORE):
            return None
        return self.candidates(iteration, "explore")

    def _remember(self, iteration: int, stage: str, found: dict) -> None:
        self._candidates[(iteration, stage)] = found
        for key in [key for key in self._candidates if key[0] < iteration - 4]:
            del self._candidates[key]


class MeasuredTime:
    """The planner's seconds on a cluster: measured from the stage log's task records."""

    def __init__(self, run: RunContext, exploration: Exploration) -> None:
        self.run, self.exploration = run, exploration

    @property
    def config(self) -> RunConfig:
        return self.run.config

    def now(self) -> float:
        return time.time()

    def planning_inputs(self, iteration: int) -> PlanningInputs:
        present = self.run.cluster.workers_by_class()
        slots = sum(len(present.get(c, ())) for c in self.config.placed("explore", SPOTLIGHT)) \
            * self.config.cluster.threads_per_worker
        return PlanningInputs(slots, self._window_history(iteration - 1),
                              self._seconds_per_sample_step(iteration - 1),
                              self._replaced_rollout_s(iteration - 1))

    def plan_outcome(self, iteration: int, plan: Plan,
                     tasks: list[dict]) -> tuple[float, float | None]:
        actual = sum(t["end"] - t["start"] for t in tasks)
        window = self._window_history(iteration, last=1)   # iteration k-1's: it explored k
        return actual, (window[0] * plan.slots if window and plan.slots else None)

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
            stale = self.exploration.stale_candidates(k)
            if stale and stale["tasks"]:
                work = sum(t.get("samples", 0) * t.get("steps", 0) for t in stale["tasks"])
                busy = sum(t["end"] - t["start"] for t in stale["tasks"])
                if work:
                    return busy / work
        return None

