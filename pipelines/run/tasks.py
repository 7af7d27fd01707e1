"""What runs inside a Dask worker: a per-process context and the task functions of an iteration.

Weights reach a worker through the run store (checkpoint of a weights version), never through
the scheduler. A worker keeps the policy, reward model and trainer of a run in memory between
tasks (:class:`WorkerContext`), so consecutive tasks at the same weights version load nothing.
Bulk data (trajectories) stays in that context; tasks hand each other small results, and a
task that finds its input missing (another worker, a resumed run) reads it from the store.

Every task returns a ``record``: stage, iteration, worker, start, end and weights version.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.cluster.preemption import StopAtStep, check_notice
from spotlight.config import RunConfig, config_hash
from spotlight.models.base import Policy, build_policy, stores_prompts
from spotlight.models.prompts import Prompt
from spotlight.rewards import build_reward, check_rewards
from spotlight.rl.grpo import Advantages, group_advantages
from spotlight.rl.sampler import (Trajectory, initial_latents, sample, schedule_of, step_grid,
                                  trainable_steps, transition_distribution)
from spotlight.rl.sde import gaussian_log_prob
from spotlight.rl.trainer import FlowGRPO, Rollout, mark_trainable, sample_keys
from spotlight.rl.validation import validate
from storage import RunStore
from storage.latents import Labels

ROLLOUT_REQUEST = "batch"   # runs before grpo.request_prompts stored one request, the whole batch


def stage_name(iteration: int, stage: str) -> str:
    return f"iter-{iteration}/{stage}"


def explore_request(prompt_index: int, chunk: int) -> str:
    return f"p{prompt_index:04d}-c{chunk:04d}"


def worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return f"local-{os.getpid()}"


def task_record(stage: str, iteration: int, start: float, version: int, **info) -> dict:
    return {"stage": stage, "iteration": iteration, "worker": worker_name(), "start": start,
            "end": time.time(), "weights_version": version, **info}


@dataclass(frozen=True)
class RolloutRequest:
    """Roll out ``prompts`` x ``seeds`` (P x G) with weights ``version`` for ``iteration``."""

    iteration: int
    prompts: list[Prompt]
    seeds: np.ndarray
    version: int


@dataclass(frozen=True)
class ExploreRequest:
    """Score candidate ``seeds`` of one prompt by replaying the rollout's sampler.

    ``iteration`` is the iteration the seeds are for; with stale weights ``version`` is
    ``iteration - 1``. ``stage`` is ``explore``, ``explore-sync`` or ``audit``; ``steps`` the
    replay's model evaluations (None: ``exploration.steps`` or the rollout's).
    """

    iteration: int
    prompt_index: int
    prompt: Prompt
    seeds: np.ndarray
    chunk: int
    version: int
    stage: str = "explore"
    steps: int | None = None

    @property
    def name(self) -> str:
        """The request's name in its stage (and its latent stream's)."""
        return explore_request(self.prompt_index, self.chunk)


@dataclass(frozen=True)
class TrainRequest:
    """One Flow-GRPO update of weights ``version`` on iteration ``iteration``'s rollout."""

    iteration: int
    prompts: list[Prompt]
    rewards: np.ndarray       # (P, G)
    advantages: dict          # the advantages task's values, kept, group_std
    version: int


@dataclass
class RolloutOutput:
    """A rollout held in worker memory: the trajectory and the record of the task that made it."""

    iteration: int
    trajectory: Trajectory
    record: dict


class WorkerContext:
    """One run's policy, reward and trainer inside one worker process."""

    def __init__(self, config: RunConfig, store: RunStore) -> None:
        torch.set_num_threads(config.cluster.threads_per_worker)
        self.config, self.store = config, store
        self.policy: Policy = build_policy(config)   # the model named in model.policy
        mark_trainable(self.policy, config.grpo.trainable)   # as the training worker's is
        if stores_prompts(config):   # embeddings from the run store: no text encoder here
            self.policy.use_prompt_store(store.prompts.get, store.prompts.put)
        self.version: int | None = None
        self.reward_fn = build_reward(config.reward)
        self.trainer: FlowGRPO | None = None
        self.trainer_version: int | None = None
        self.rollouts: dict[int, RolloutOutput] = {}
        self.lock = threading.Lock()

    def policy_at(self, version: int) -> Policy:
        """The policy with the weights of ``version`` (loaded from the run store if needed)."""
        if self.version != version:
            checkpoint = self.store.load_checkpoint(version)
            self.policy.load_state_dict(checkpoint.weights)
            self.version = version
            self.trainer_version = None   # the optimizer state no longer matches
        return self.policy

    def trainer_at(self, version: int) -> FlowGRPO:
        """The trainer whose weights and optimizer state are those of ``version``."""
        if self.trainer is None:
            self.policy_at(0)   # the frozen KL reference is the base model
            self.trainer = FlowGRPO(self.config, self.policy, self.reward_fn, check_rewards)
            self.trainer_version = 0 if self.version == 0 else None
        if self.trainer_version != version or self.version != version:
            checkpoint = self.store.load_checkpoint(version)
            self.policy.load_state_dict(checkpoint.weights)
            self.trainer.load_optimizer_state(checkpoint.optimizer_state)
            self.version = self.trainer_version = version
        return self.trainer

    def rollout(self, iteration: int) -> RolloutOutput:
        """The rollout of ``iteration``: from memory, else rebuilt from the run store."""
        held = self.rollouts.get(iteration)
        if held is not None:
            return held
        stage = stage_name(iteration, "rollout")
        arrays = self.store.get_arrays(stage, "rollout")
        if "latents" in arrays:
            latents = torch.from_numpy(arrays["latents"])
        else:   # one streamed batch, or one stream per prompt (a pulled rollout), in order
            names = self.store.requests(stage)   # listed once: one round trip
            names = [ROLLOUT_REQUEST] if ROLLOUT_REQUEST in names else sorted(names)
            latents = torch.cat([torch.from_numpy(np.asarray(self.store.read_trajectory(stage, n)))
                                 for n in names], dim=1)
            latents = latents.transpose(0, 1).contiguous()   # stored (step, batch, ...)
        sampler = self.config.sampler
        traj = Trajectory(latents.float(), torch.from_numpy(arrays["log_probs"]).float(),
                          step_grid(sampler, schedule=schedule_of(self.policy, sampler)).sigmas,
                          trainable_steps(sampler))
        return RolloutOutput(iteration, traj, {})


_CONTEXTS: dict[str, WorkerContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def context(config: RunConfig, store: RunStore) -> WorkerContext:
    key = f"{store.url}|{config_hash(config.to_dict())}"
    with _CONTEXTS_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _CONTEXTS[key] = WorkerContext(config, store)
        return ctx


def forget_contexts() -> None:
    """Drop every run's in-memory state in this process (tests; a finished run)."""
    with _CONTEXTS_LOCK:
        _CONTEXTS.clear()


# --- tasks ------------------------------------------------------------------------------------
def warm_up_task(config: RunConfig, store: RunStore, version: int) -> dict:
    """Import the model code, build the reward and load weights ``version`` in this worker.

    Submitted to every worker when a session starts: otherwise a spot worker's first
    exploration request spends the first training window importing and loading instead.
    """
    start = time.time()
    ctx = context(config, store)
    with ctx.lock:
        ctx.policy_at(version)
    return task_record("warm-up", max(version - 1, 0), start, version)


def embed_prompts_task(config: RunConfig, store: RunStore, iteration: int,
                       prompts: list[str]) -> dict:
    """Put the embeddings of ``prompts`` the run store lacks into it (on a gpu worker, before
    the iteration's rollout and exploration), so spot workers never load the text encoder."""
    start = time.time()
    ctx = context(config, store)
    with ctx.lock:
        for prompt in dict.fromkeys(prompts):
            ctx.policy.prompt_embedding(prompt)   # remembered, else read, else computed + saved
    return task_record("embed", iteration, start, ctx.version or 0, prompts=len(prompts))


def _sample_streamed(ctx: WorkerContext, prompts: list[str], seeds: np.ndarray, keys, stage: str,
                     request: str, version: int, num_steps: int | None = None,
                     progress: dict | None = None, member=None) -> Trajectory:
    """SDE-sample one request, committing the latent after every step when streaming is on.

    A request the store already holds steps of (an earlier attempt was killed) resumes from its
    last committed step; the steps before it are read back and their log-probabilities
    recomputed, so the trajectory equals an uninterrupted one bit for bit.

    With ``progress`` (a dict) the request is preemptible: after a notice it stops at the next
    step boundary with :class:`~pipelines.cluster.preemption.StopAtStep`, once that step is committed;
    ``progress`` says where it resumed from and when its first and last new steps were
    committed (``first_step``: the step committed at ``first_step_at``).

    With ``member`` (:class:`~pipelines.parallel.executor.GroupMember`) this is one member of
    an SP group running the same request: every member computes the same steps, the leader
    alone reads where the request stands (the others take its answer) and commits.
    """
    config = ctx.config
    steps = num_steps or config.sampler.num_steps
    if not config.stream_latents:
        return sample(ctx.policy, prompts, keys, config.sampler, mode="sde", num_steps=steps)
    leads = member is None or member.leads
    point = _resume_point(ctx.store, stage, request, version, member)
    start = 0 if point is None else point.step
    if progress is not None:
        progress.update(resumed_from=start, first_step_at=None)
        if member is None:   # a group's members stop together only when the group breaks
            check_notice(start)   # noticed before it began: hand it back untouched
    labels = _latent_labels(config, prompts, seeds, steps, version, ctx.policy)
    with ctx.store.latent_sink(stage) if leads else contextlib.nullcontext() as sink:
        def commit(step: int, x: torch.Tensor) -> None:
            if sink is None:
                return
            sink.commit(request, step, x.numpy(), num_steps=steps, weights_version=version,
                        labels=labels)
            if progress is not None and step > 0:
                progress["last_step_at"] = time.time()
                if progress["first_step_at"] is None:
                    progress["first_step_at"] = progress["last_step_at"]
                    progress["first_step"] = step
                if step < steps and member is None:
                    check_notice(step)   # the latent is queued; the sink's exit commits it

        if point is None:
            commit(0, initial_latents(keys, ctx.policy.tokens_shape))
        traj = sample(ctx.policy, prompts, keys, config.sampler, mode="sde", num_steps=steps,
                      start_step=start, start_latents=None if point is None
                      else torch.from_numpy(np.asarray(point.latent)),
                      on_step=lambda t, x: commit(t + 1, x))
    if start > 0:
        earlier = np.asarray(ctx.store.latents.read_steps(stage, request, 0, start))
        traj.latents[:, :start] = torch.from_numpy(earlier).transpose(0, 1)
        _recompute_log_probs(ctx.policy, traj, prompts, config, start, steps)
    return traj


def _resume_point(store: RunStore, stage: str, request: str, version: int, member):
    """The request's last committed step (None: none), read by the group's leader alone and
    agreed on by its other members; a step of another weights version is an error."""
    leads = member is None or member.leads
    point = store.resume_point(stage, request) if leads else None
    point = point if member is None else member.agree(point)
    if point is not None and point.weights_version != version:
        raise RuntimeError(f"{stage}/{request} was started with weights version "
                           f"{point.weights_version}, now asked for {version}")
    return point


def _latent_labels(config: RunConfig, prompts: list[str], seeds: np.ndarray, steps: int,
                   version: int, policy: Policy) -> Labels:
    """What a stored request's latents are: per sample its prompt and seed, per step its σ."""
    return Labels(("sample", "token", "channel"), {
        "prompt": ("sample", list(prompts)), "seed": ("sample", np.asarray(seeds).reshape(-1)),
        "sigma": ("step", step_grid(config.sampler, steps, schedule=schedule_of(
            policy, config.sampler)).sigmas.double().numpy()),
        "weights_version": ("", np.int64(version))})


@torch.no_grad()
def _recompute_log_probs(policy, traj: Trajectory, prompts: list[str], config: RunConfig,
                         stop: int, steps: int) -> None:
    """Fill the log-probabilities of the SDE steps before ``stop`` from the stored latents."""
    sampler = config.sampler
    if steps != sampler.num_steps:
        return   # exploration replays use no log-probabilities
    text = policy.encode(prompts)
    for t in traj.trainable_steps:
        if t < stop:
            dist = transition_distribution(policy, traj.latents, t, traj.sigmas, text, sampler)
            traj.log_probs[:, t] = gaussian_log_prob(traj.latents[:, t + 1], dist)


def load_rollout_task(config: RunConfig, store: RunStore, iteration: int) -> RolloutOutput:
    """A finished rollout read back from the run store (resumed runs; never recomputed)."""
    ctx = context(config, store)
    with ctx.lock:
        return ctx.rollout(iteration)


def reward_task(config: RunConfig, store: RunStore, rollout: RolloutOutput, prompts: list[Prompt],
                group: int, version: int) -> dict:
    """Decode the rollout's final latents and score them; persisted before it returns."""
    start = time.time()
    ctx = context(config, store)
    flat = [p for p in prompts for _ in range(group)]
    with ctx.lock:
        images = ctx.policy.decode(rollout.trajectory.final)
        rewards = np.asarray(ctx.reward_fn(images, flat), dtype=np.float64)
    check_rewards(rewards, "rollout")
    rewards = rewards.reshape(len(prompts), group)
    store.put_arrays(stage_name(rollout.iteration, "reward"), "reward", {"rewards": rewards})
    return {"rewards": rewards, "records": [rollout.record] if rollout.record else [],
            "record": task_record("reward", rollout.iteration, start, version)}


def advantages_task(config: RunConfig, iteration: int, rewards: np.ndarray, version: int) -> dict:
    start = time.time()
    grpo = config.grpo
    adv = group_advantages(rewards, global_std=grpo.global_std, clip=grpo.adv_clip_max)
    return {"values": adv.values, "kept": adv.kept, "group_std": adv.group_std,
            "record": task_record("advantages", iteration, start, version)}


def train_task(config: RunConfig, store: RunStore, rollout: RolloutOutput,
               request: TrainRequest, peers=None) -> dict:
    """One Flow-GRPO update θ_version -> θ_version+1; returns the new state for the checkpoint.
    With data-parallel ``peers`` (:mod:`pipelines.parallel.training`) this worker computes its
    share and every peer takes the same step."""
    start = time.time()
    prompts, rewards, advantages, version = (request.prompts, request.rewards,
                                             request.advantages, request.version)
    ctx = context(config, store)
    group = rewards.shape[1]
    with ctx.lock:
        trainer = ctx.trainer_at(version)
        flat = [p for p in prompts for _ in range(group)]
        batch = Rollout(flat, [], rollout.trajectory, np.empty(0), rewards)
        adv = Advantages(advantages["values"], advantages["kept"], advantages["group_std"])
        trainer.peers = peers
        try:
            stats = trainer.train(batch, adv, rollout.iteration)
        except BaseException:
            ctx.version = ctx.trainer_version = None   # a step cut half-way: reload to retry
            raise
        finally:
            trainer.peers = None
        ctx.version = ctx.trainer_version = version + 1
        weights = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        optimizer_state = trainer.optimizer.state_dict()
    info = {} if peers is None else {"data_parallel": peers.world}
    return {"weights": weights, "optimizer_state": optimizer_state, "stats": stats,
            "record": task_record("train", rollout.iteration, start, version, **info)}


def checkpoint_task(config: RunConfig, store: RunStore, trained: dict, iteration: int,
                    version: int) -> dict:
    """Write θ_version+1 (weights and optimizer state) to the run store; the returned
    ``checkpoint`` record is committed by the driver, the manifest's only writer."""
    start = time.time()
    saved = store.write_checkpoint(version + 1, trained["weights"], trained["optimizer_state"],
                                   metadata={"trained_in_iteration": iteration})
    return {"stats": trained["stats"], "checkpoint": saved,
            "records": [trained["record"],
                        task_record("checkpoint", iteration, start, version + 1)]}


def handed_back(store: RunStore, stage: str, request: str, stop: StopAtStep,
                record: dict) -> dict:
    """The result of a request handed back after a preemption notice: a result, not a failure.
    The sink has closed, so everything through ``stop.step`` is committed (lost steps:
    computed minus committed)."""
    point = store.resume_point(stage, request)
    return {"preempted": True, "step": 0 if point is None else int(point.step),
            "computed_step": stop.step, "record": record}


def explore_task(config: RunConfig, store: RunStore, request: ExploreRequest) -> dict:
    """Score candidate seeds of one prompt by replaying the rollout's SDE sampler (see
    :class:`ExploreRequest`). One call is one request of fixed batch shape."""
    start = time.time()
    iteration, prompt_index, prompt, seeds, chunk, version, stage = (
        request.iteration, request.prompt_index, request.prompt, request.seeds, request.chunk,
        request.version, request.stage)
    ctx = context(config, store)
    steps = request.steps or config.exploration.steps or config.sampler.num_steps
    where, name = stage_name(iteration, stage), request.name
    progress: dict = {}
    with ctx.lock:
        policy = ctx.policy_at(version)
        policy.eval()
        keys = sample_keys(config.seed, [prompt], np.asarray(seeds)[None, :])
        try:
            traj = _sample_streamed(ctx, [prompt.text] * len(seeds), np.asarray(seeds), keys,
                                    where, name, version, num_steps=steps, progress=progress)
        except StopAtStep as stop:
            return {**handed_back(store, where, name, stop, task_record(
                        stage, iteration, start, version, request=name, preempted=True,
                        **progress)), "prompt_index": prompt_index, "chunk": chunk}
        images = policy.decode(traj.final)
        rewards = np.asarray(ctx.reward_fn(images, [prompt] * len(seeds)), dtype=np.float64)
    check_rewards(rewards, "exploration")
    return {"prompt_index": prompt_index, "chunk": chunk, "seeds": np.asarray(seeds),
            "rewards": rewards,
            "record": task_record(stage, iteration, start, version, prompt_index=prompt_index,
                                  chunk=chunk, samples=len(seeds), steps=steps, request=name,
                                  text_encoder=bool(getattr(policy, "text_encoder_loaded", False)),
                                  **progress)}


def validation_task(config: RunConfig, store: RunStore, iteration: int, prompts: list[Prompt],
                    version: int) -> dict:
    """Deterministic ODE validation of weights ``version`` on held-out prompts."""
    start = time.time()
    ctx = context(config, store)
    with ctx.lock:
        result = validate(ctx.policy_at(version), prompts, ctx.reward_fn, check_rewards, config)
    return {"mean_reward": result.mean_reward, "rewards": result.rewards,
            "images": result.images.astype(np.float16),
            "record": task_record("validation", iteration, start, version)}
