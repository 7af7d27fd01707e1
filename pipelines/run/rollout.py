"""An iteration's rollout: one backend interface, three backends, one :func:`finish_rollout`.

The rollout is split into requests of ``grpo.request_prompts`` prompts, each with its whole
group of seeds -- fixed batch shapes, the same split wherever the rollout runs, so the latents
and log-probabilities do not depend on which worker computes them. A backend runs the requests:

- :class:`OneGpuTask`: on gpu workers alone (``placement.rollout: [gpu]``), in order in one
  task, which keeps the trajectory in its worker's memory for reward and training;
- :class:`PulledRequests`: pulled by every worker the placement allows, gpu and spot
  (:class:`~pipelines.cluster.dispatch.RequestPool`), with adaptive offload -- the tail goes to
  whoever finishes first by measured speed, and an idle gpu worker re-runs a straggling spot
  request;
- :class:`~pipelines.run.sp_rollout.SPGroupsBackend`: on sequence-parallel groups.

Every request is written by its worker (:mod:`pipelines.run.rollout_store`): latents streamed
step by step (a preempted attempt resumes from its last committed step), log-probabilities when
it finishes. :func:`finish_rollout` then writes the stage's index and records the stage, once,
whichever backend ran it; reward and training read the trajectory back from the run store.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.cluster.preemption import WARM_UP_KEY, HandedBack
from pipelines.run import rollout_store, tasks
from pipelines.run.context import StageContext
from pipelines.run.stage_log import StageLog
from pipelines.run.stages import RolloutResult, Stage
from pipelines.run.streamed import (
    RequestRun,
    RolledOut,
    StreamedRequest,
    run_streamed_request,
    sample_streamed,
)
from spotlight.models.prompts import Prompt
from spotlight.rl.sampler import Trajectory
from spotlight.rl.trainer import rollout_chunks, sample_keys
from spotlight.scheduling.dispatch import Offload
from storage import RunStore
from storage.attempts import FIRST, Attempt


@dataclass(frozen=True)
class RolloutChunk:
    """One rollout request: ``prompts`` (the iteration's from index ``first`` on), each with its
    group of ``seeds`` (one row per prompt), rolled out with weights ``version``."""

    iteration: int
    first: int
    prompts: list[Prompt]
    seeds: np.ndarray
    version: int
    part: bool = False   # of a rollout of the unexplored prompts only (RolloutRequest.part)

    @property
    def name(self) -> str:
        # A part's requests are named apart: should the iteration be rolled out whole after
        # all, its requests hold other prompts and must not resume from the part's latents.
        return f"{'r' if self.part else 'p'}{self.first:04d}"

    @property
    def streamed(self) -> StreamedRequest:
        """Where the request's latents stream."""
        return StreamedRequest(self.name, self.version, "rollout", self.iteration)

    def inputs(self, run_seed: int) -> tuple[list[str], Any]:
        """The prompt of every sample (groups in order) and the samples' random keys."""
        texts = [p.text for p in self.prompts for _ in range(self.seeds.shape[1])]
        return texts, sample_keys(run_seed, self.prompts, self.seeds)

    def sample(self, run: RequestRun, member=None):
        """SDE-sample the request as one attempt ``run`` (``member``: as one member of an SP
        group, :mod:`pipelines.run.sp_rollout`, which hears no notice of its own)."""
        texts, keys = self.inputs(run.ctx.config.seed)
        return run.sample(texts, self.seeds, keys, member=member)

    def rolled_out(self, run: RequestRun, member=None) -> RolledOut:
        """Sample the request and write its log-probabilities (the group's leader alone)."""
        traj = self.sample(run, member)
        where = run.request
        file = rollout_store.request_file(self.name, where.attempt)
        if member is None or member.leads:
            rollout_store.save_request(run.ctx.store, where.stage, self.name, where.attempt,
                                       traj.log_probs.cpu().numpy())
        record = run.record(samples=self.seeds.size, **(
            {} if member is None else {"sp_degree": member.size}))
        return RolledOut(self.name, run.progress["resumed_from"], record, file)


def rollout_requests(config, request: tasks.RolloutRequest) -> list[RolloutChunk]:
    """The fixed-shape requests an iteration's rollout is sampled in, wherever it runs."""
    return [RolloutChunk(request.iteration, c.start, request.prompts[c],
                         np.asarray(request.seeds[c]), request.version, request.part)
            for c in rollout_chunks(len(request.prompts), config.grpo.request_prompts)]


def rollout_request_of(asked) -> tasks.RolloutRequest:
    """What a :class:`~spotlight.iteration.requests.RollOut` asks for: every prompt, or only
    its ``rows`` (a part, for the explored samples to join)."""
    if asked.rows is None:
        return tasks.RolloutRequest(asked.iteration, asked.prompts, asked.seeds, asked.iteration)
    rows = list(asked.rows)
    return tasks.RolloutRequest(asked.iteration, [asked.prompts[p] for p in rows],
                                np.asarray(asked.seeds)[rows], asked.iteration, part=True)


def rollout_task(config, store, request: tasks.RolloutRequest,
                 attempt: Attempt = FIRST) -> tasks.RolloutOutput:
    """The whole rollout on one gpu worker (``placement.rollout: [gpu]``): its requests in
    order, each persisted before it returns, kept in memory for reward and training."""
    start = time.time()
    attempt = Attempt(*attempt)
    ctx = tasks.context(config, store)
    with ctx.lock:
        ctx.policy_at(request.version).eval()
        trajectories = []
        for chunk in rollout_requests(config, request):
            texts, keys = chunk.inputs(config.seed)
            traj = sample_streamed(ctx, texts, chunk.seeds, keys,
                                   chunk.streamed.as_attempt(attempt))
            rollout_store.save_request(store, chunk.streamed.stage, chunk.name, attempt,
                                       traj.log_probs.cpu().numpy(), None if config.stream_latents
                                       else traj.latents.cpu().numpy())
            trajectories.append(traj)
        out = tasks.RolloutOutput(request.iteration, Trajectory.concat(trajectories),
                                  tasks.task_record("rollout", request.iteration, start,
                                                    request.version))
        # Keep only the newest, so memory stays bounded; a part is never held, so no worker
        # can mistake it for the iteration's whole rollout (it is joined in the store).
        ctx.rollouts = {} if request.part else {request.iteration: out}
        return out


def task_record_of(out: tasks.RolloutOutput) -> dict:
    """The record of a rollout held by its worker (fetched without its trajectory)."""
    return out.record


def rollout_chunk_task(config, store, chunk: RolloutChunk,
                       attempt: Attempt = FIRST) -> RolledOut | HandedBack:
    """One attempt of a pulled request, preemptible at step boundaries (then handed back,
    committed)."""
    return run_streamed_request(tasks.context(config, store), chunk.streamed.as_attempt(attempt),
                                chunk.rolled_out)


def newcomer_warm_up(client, config, store, version: int):
    """``warm_up`` of a :class:`RequestPool`: a worker that joins mid-stage loads weights
    ``version`` (checked against the run store's checkpoint) before it pulls a request."""
    import uuid

    def submit(address: str):
        return client.submit(tasks.warm_up_task, config, store, version, workers=[address],
                             allow_other_workers=False, pure=False,
                             key=f"{WARM_UP_KEY}{version}-{uuid.uuid4().hex[:8]}")

    return submit


@dataclass
class RolloutDone:
    """What a backend hands :func:`finish_rollout`: the requests' task records (for the
    timeline), the stage's result (how it ran) and, from :class:`OneGpuTask` alone, the future
    whose worker holds the rollout in memory for reward."""

    records: list[dict]
    result: RolloutResult
    held: Any = None
    files: dict[str, str] = dataclasses.field(default_factory=dict)   # request -> log-probs


class RolloutBackend(Protocol):
    def run(self, ctx: StageContext, chunks: list[RolloutChunk]) -> RolloutDone: ...


class OneGpuTask:
    """The requests in order in one task on one gpu worker."""

    def run(self, ctx: StageContext, chunks: list[RolloutChunk]) -> RolloutDone:
        first = chunks[0]
        prompts = [p for c in chunks for p in c.prompts]
        seeds = np.concatenate([c.seeds for c in chunks])
        attempt = Attempt(ctx.store.epoch, 1)   # one task: the driver's only attempt
        where = ctx.worker_class("rollout")
        held = ctx.submit(rollout_task, ctx.config, ctx.store,
                          tasks.RolloutRequest(first.iteration, prompts, seeds, first.version,
                                               first.part),
                          attempt, resource=where, name="rollout")
        # The record alone comes back: the trajectory stays on its worker for reward.
        # (Dask runs it where that trajectory is, the costliest thing to move.)
        record = ctx.result(ctx.submit(task_record_of, held, resource=where,
                                       name="rollout-record"),
                            f"iteration {first.iteration}'s rollout", where)
        return RolloutDone([record], RolloutResult(task=record), held,
                           {c.name: rollout_store.request_file(c.name, attempt) for c in chunks})


class PulledRequests:
    """Requests pulled by the workers of the rollout's placement, gpu and spot."""

    def run(self, ctx: StageContext, chunks: list[RolloutChunk]) -> RolloutDone:
        config, store, iteration = ctx.config, ctx.store, chunks[0].iteration
        classes = ctx.placed("rollout")
        stage = chunks[0].streamed.stage
        # Spot requests that straggle are re-run on idle on-demand workers (RLBoost's offload).
        on_demand = tuple(c for c in classes if c != "spot") if "spot" in classes else ()
        specs = [RequestSpec(c.name, rollout_chunk_task, (config, store, c), stage, c.name,
                             numbered=True) for c in chunks]
        pool = RequestPool(ctx.cluster, specs, config.preemption, store=store,
                           resource=classes, watch_progress=config.stream_latents,
                           cut_off=ctx.carried.cut_off,
                           offload=Offload(speculate_on=on_demand) if on_demand else None,
                           on_event=lambda kind, info: ctx.emit(kind, stage="rollout", **info),
                           warm_up=newcomer_warm_up(ctx.cluster.client, config, store,
                                                    chunks[0].version))
        # Waiting (stops with the run, fails when no gpu worker is left) and collecting (the
        # dispatch log into the run's events) are exploration's, shared.
        ctx.exploration.wait_all(pool, "the rollout")
        finished, _, dispatch = ctx.exploration.collect(pool, "rollout")
        results = {out.request: out for out in finished}
        summary = dispatch["summary"]
        missing = [c.name for c in chunks if c.name not in results]
        if missing:
            raise RuntimeError(f"iteration {iteration}'s rollout could not finish: requests "
                               f"{missing[:5]} were not run ({summary['gave_up'] or 'stopped'}); "
                               f"add workers of {list(classes)} and resume the run")
        store.put_json(stage, "dispatch", dispatch)
        return RolloutDone([results[c.name].record for c in chunks],
                           RolloutResult(dispatch=summary),
                           files={c.name: results[c.name].log_probs for c in chunks})


def finish_rollout(store: RunStore, log: StageLog, chunks: list[RolloutChunk],
                   seeds: np.ndarray, done: RolloutDone) -> list[dict]:
    """Every request is in the store: write the stage's index and record the stage -- once,
    whichever backend or executor ran it. Returns the requests' task records. A part (the
    unexplored prompts) is indexed for the join to read, and not recorded: the stage is done
    when the join has written the whole rollout."""
    iteration = chunks[0].iteration
    rollout_store.write_index(store, chunks[0].streamed.stage, [c.name for c in chunks],
                              [done.files[c.name] for c in chunks], seeds)
    if not chunks[0].part:
        log.record(iteration, Stage.ROLLOUT, done.result)
    return done.records
