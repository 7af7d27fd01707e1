"""A rollout pulled by every worker its placement allows (``placement.rollout``), gpu and spot.

The rollout is split into requests of ``grpo.request_prompts`` prompts, each with its whole
group of seeds -- fixed batch shapes, the same split wherever the rollout runs, so the latents
and log-probabilities do not depend on which worker computes them -- and handed out by the
pull dispatch (:class:`~pipelines.cluster.dispatch.RequestPool`) with adaptive offload: the
tail goes to whoever finishes first by measured speed, and an idle gpu worker re-runs a
straggling spot request. On gpu workers alone the requests run in order in
one task instead (:func:`rollout_task`). Each request streams its latents to
``iter-K/rollout.zarr/latents/pNNNN`` and resumes a preempted attempt from its last committed
step. When every request is in, the log-probabilities go to ``rollout.npz`` and the stage is
recorded; reward and training read the trajectory back from the run store on a gpu worker.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.cluster.preemption import StopAtStep
from pipelines.run import tasks
from pipelines.run.stages import RolloutResult
from spotlight.models.prompts import Prompt
from spotlight.rl.sampler import Trajectory
from spotlight.rl.trainer import rollout_chunks, sample_keys
from spotlight.scheduling.dispatch import Offload


@dataclass(frozen=True)
class RolloutChunk:
    """One rollout request: ``prompts`` (the iteration's from index ``first`` on), each with its
    group of ``seeds`` (one row per prompt), rolled out with weights ``version``."""

    iteration: int
    first: int
    prompts: list[Prompt]
    seeds: np.ndarray
    version: int

    @property
    def name(self) -> str:
        return f"p{self.first:04d}"


def rollout_requests(config, request: tasks.RolloutRequest) -> list[RolloutChunk]:
    """The fixed-shape requests an iteration's rollout is sampled in, wherever it runs."""
    return [RolloutChunk(request.iteration, c.start, request.prompts[c],
                         np.asarray(request.seeds[c]), request.version)
            for c in rollout_chunks(len(request.prompts), config.grpo.request_prompts)]


def _sample_chunk(ctx, chunk: RolloutChunk, progress: dict | None = None, member=None):
    """SDE-sample one request, streamed and resumed from its last committed step (``member``:
    as one member of an SP group, :mod:`pipelines.run.sp_rollout`)."""
    texts = [p.text for p in chunk.prompts for _ in range(chunk.seeds.shape[1])]
    keys = sample_keys(ctx.config.seed, chunk.prompts, chunk.seeds)
    return tasks._sample_streamed(ctx, texts, chunk.seeds, keys,
                                  tasks.stage_name(chunk.iteration, "rollout"), chunk.name,
                                  chunk.version, progress=progress, member=member)


def rollout_task(config, store, request: tasks.RolloutRequest) -> tasks.RolloutOutput:
    """The whole rollout on one gpu worker (``placement.rollout: [gpu]``): its requests in
    order, persisted before it returns, kept in memory for reward and training."""
    start = time.time()
    ctx = tasks.context(config, store)
    with ctx.lock:
        ctx.policy_at(request.version).eval()
        traj = Trajectory.concat([_sample_chunk(ctx, c)
                                  for c in rollout_requests(config, request)])
        arrays = {"log_probs": traj.log_probs.numpy(), "seeds": np.asarray(request.seeds)}
        if not config.stream_latents:
            arrays["latents"] = traj.latents.numpy()
        store.put_arrays(tasks.stage_name(request.iteration, "rollout"), "rollout", arrays)
        out = tasks.RolloutOutput(request.iteration, traj,
                                  tasks.task_record("rollout", request.iteration, start,
                                                    request.version))
        ctx.rollouts = {request.iteration: out}   # keep only the newest: memory stays bounded
        return out


def rollout_chunk_task(config, store, chunk: RolloutChunk) -> dict:
    """One pulled request, preemptible at step boundaries (then handed back, committed)."""
    start = time.time()
    ctx = tasks.context(config, store)
    progress: dict = {}
    with ctx.lock:
        ctx.policy_at(chunk.version).eval()
        try:
            traj = _sample_chunk(ctx, chunk, progress)
        except StopAtStep as stop:
            return tasks.handed_back(store, tasks.stage_name(chunk.iteration, "rollout"),
                                     chunk.name, stop, tasks.task_record(
                                         "rollout", chunk.iteration, start, chunk.version,
                                         request=chunk.name, preempted=True, **progress))
    return {"log_probs": traj.log_probs.numpy(),
            "record": tasks.task_record("rollout", chunk.iteration, start, chunk.version,
                                        request=chunk.name, samples=chunk.seeds.size,
                                        **progress)}


def pulled(classes: tuple[str, ...]) -> bool:
    """Whether a stage placed on ``classes`` is pulled request by request (a
    :class:`RequestPool`): with spot workers, which come and go, or several classes."""
    return "spot" in classes or len(classes) > 1


def newcomer_warm_up(client, config, store, version: int):
    """``warm_up`` of a :class:`RequestPool`: a worker that joins mid-stage loads weights
    ``version`` (checked against the run store's checkpoint) before it pulls a request."""
    import uuid

    def submit(address: str):
        return client.submit(tasks.warm_up_task, config, store, version, workers=[address],
                             allow_other_workers=False, pure=False,
                             key=f"newcomer-{version}-{uuid.uuid4().hex[:8]}")

    return submit


def pulled_rollout(driver, iteration: int, prompts: list[Prompt], seeds: np.ndarray) -> list:
    """Run iteration ``iteration``'s rollout as pulled requests; write ``rollout.npz`` and
    record the stage. Returns the requests' task records (for the timeline)."""
    config, store = driver.config, driver.store
    classes = driver.placed("rollout")
    stage = tasks.stage_name(iteration, "rollout")
    # Spot requests that straggle are re-run on idle on-demand workers (RLBoost's offload).
    on_demand = tuple(c for c in classes if c != "spot") if "spot" in classes else ()
    chunks = rollout_requests(config, tasks.RolloutRequest(iteration, prompts, seeds, iteration))
    specs = [RequestSpec(c.name, rollout_chunk_task, (config, store, c), stage, c.name)
             for c in chunks]
    pool = RequestPool(driver.cluster, specs, config.preemption, store=store, resource=classes,
                       offload=Offload(speculate_on=on_demand) if on_demand else None,
                       on_event=lambda kind, info: driver.emit(kind, stage="rollout", **info),
                       warm_up=newcomer_warm_up(driver.cluster.client, config, store, iteration))
    # Waiting (stops with the run, fails when no gpu worker is left) and collecting (the
    # dispatch log into the run's events) are exploration's, shared.
    driver.exploration.wait_all(pool, "the rollout")
    finished, _, dispatch = driver.exploration.collect(pool, "rollout")
    results = {out["record"]["request"]: out for out in finished}
    summary = dispatch["summary"]
    missing = [c.name for c in chunks if c.name not in results]
    if missing:
        raise RuntimeError(f"iteration {iteration}'s rollout could not finish: requests "
                           f"{missing[:5]} were not run ({summary['gave_up'] or 'stopped'}); "
                           f"add workers of {list(classes)} and resume the run")
    log_probs = np.concatenate([results[c.name]["log_probs"] for c in chunks])
    store.put_arrays(stage, "rollout", {"log_probs": log_probs, "seeds": np.asarray(seeds)})
    store.put_json(stage, "dispatch", dispatch)
    records = [results[c.name]["record"] for c in chunks]
    driver.log.record(iteration, "rollout", RolloutResult(dispatch=summary))
    return records
