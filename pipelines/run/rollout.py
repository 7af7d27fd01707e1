"""A rollout pulled by every worker its placement allows (``placement.rollout``), gpu and spot.

The rollout is split into one request per prompt -- that prompt's whole group of seeds, a fixed
batch shape, so the latents and log-probabilities are the same whichever worker computes them
-- and handed out by the pull dispatch (:class:`~pipelines.cluster.dispatch.RequestPool`) with
adaptive offload: the tail goes to whoever finishes first by measured speed, and an idle gpu
worker re-runs a straggling spot request. Each request streams its latents to
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
from spotlight.rl.trainer import sample_keys
from spotlight.scheduling.dispatch import Offload


@dataclass(frozen=True)
class RolloutChunk:
    """Roll out one prompt's group (``seeds``, G of them) with weights ``version``."""

    iteration: int
    prompt_index: int
    prompt: Prompt
    seeds: np.ndarray
    version: int

    @property
    def name(self) -> str:
        return f"p{self.prompt_index:04d}"


def rollout_chunk_task(config, store, chunk: RolloutChunk) -> dict:
    """SDE rollout of one prompt's group, streamed and preemptible at step boundaries."""
    start = time.time()
    ctx = tasks.context(config, store)
    stage = tasks.stage_name(chunk.iteration, "rollout")
    progress: dict = {}
    with ctx.lock:
        policy = ctx.policy_at(chunk.version)
        policy.eval()
        keys = sample_keys(config.seed, [chunk.prompt], np.asarray(chunk.seeds)[None, :])
        try:
            traj = tasks._sample_streamed(ctx, [chunk.prompt.text] * len(chunk.seeds),
                                          np.asarray(chunk.seeds), keys, stage, chunk.name,
                                          chunk.version, progress=progress)
        except StopAtStep as stop:
            point = store.resume_point(stage, chunk.name)
            return {"preempted": True, "step": 0 if point is None else int(point.step),
                    "computed_step": stop.step,
                    "record": tasks.task_record("rollout", chunk.iteration, start, chunk.version,
                                                request=chunk.name, preempted=True, **progress)}
    return {"prompt_index": chunk.prompt_index, "log_probs": traj.log_probs.numpy(),
            "record": tasks.task_record("rollout", chunk.iteration, start, chunk.version,
                                        request=chunk.name, samples=len(chunk.seeds),
                                        **progress)}


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
    classes = tuple(config.placement.rollout)
    stage = tasks.stage_name(iteration, "rollout")
    chunks = [RolloutChunk(iteration, i, p, np.asarray(seeds[i]), iteration)
              for i, p in enumerate(prompts)]
    specs = [RequestSpec(c.name, rollout_chunk_task, (config, store, c), stage, c.name)
             for c in chunks]
    pool = RequestPool(driver.cluster, specs, config.preemption, store=store, resource=classes,
                       offload=Offload(speculate_on=("gpu",)) if len(classes) > 1 else None,
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
