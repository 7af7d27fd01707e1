"""What runs inside a Dask worker: a per-process context and the task functions of an iteration.

Weights reach a worker through the run store (checkpoint of a weights version), never through
the scheduler. A worker keeps the policy, reward model and trainer of a run in memory between
tasks (:class:`WorkerContext`), so consecutive tasks at the same weights version load nothing.
Bulk data (trajectories) stays in that context; tasks hand each other small results, and a
task that finds its input missing (another worker, a resumed run) reads it from the store.

Every task returns a ``record``: stage, iteration, worker, start, end and weights version.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.cluster.preemption import HandedBack
from pipelines.cluster.runtime import runtime
from pipelines.run.records import (
    STAGES_WITH_SAMPLES,
    explore_request,
    explored_samples,
    stage_name,
    task_record,
)
from pipelines.run.rollout_store import read_rollout
from pipelines.run.streamed import Explored, RequestRun, StreamedRequest, run_streamed_request
from spotlight.config import RunConfig, config_hash
from spotlight.models.base import Policy, base_policy, build_policy, stores_prompts
from spotlight.models.prompts import Prompt
from spotlight.rewards import build_reward, check_rewards
from spotlight.rl.grpo import Advantages, group_advantages
from spotlight.rl.objectives import build_trainer
from spotlight.rl.sampler import Trajectory, schedule_of, step_grid, trainable_steps
from spotlight.rl.trainer import FlowGRPO, Rollout, mark_trainable, sample_keys
from spotlight.rl.validation import validate
from storage import RunStore
from storage.attempts import FIRST, Attempt
from storage.checkpoints import OPTIMIZER_SHARDS


@dataclass(frozen=True)
class RolloutRequest:
    """Roll out ``prompts`` x ``seeds`` (P x G) with weights ``version`` for ``iteration``.
    ``part``: these are only the prompts exploration did not cover, to be joined with the
    explored samples (:func:`pipelines.run.explored.explored_rollout_task`)."""

    iteration: int
    prompts: list[Prompt]
    seeds: np.ndarray
    version: int
    part: bool = False


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
        self.sharded_trainer: FlowGRPO | None = None   # parallel.shard_training's
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
            self.trainer = build_trainer(self.config, self.policy, self.reward_fn, check_rewards)
            self.trainer_version = 0 if self.version == 0 else None
        if self.trainer_version != version or self.version != version:
            checkpoint = self.store.load_checkpoint(version)
            if checkpoint.metadata.get("optimizer") == OPTIMIZER_SHARDS:
                raise RuntimeError(
                    f"checkpoint {version} of {self.store.url} was trained with "
                    "parallel.shard_training: its optimizer state is in shards. Continue the "
                    "run with parallel.shard_training: true")
            self.policy.load_state_dict(checkpoint.weights)
            self.trainer.load_training_state(checkpoint.optimizer_state)
            self.version = self.trainer_version = version
        return self.trainer

    def rollout(self, iteration: int) -> RolloutOutput:
        """The rollout of ``iteration``: from memory, else rebuilt from the run store."""
        held = self.rollouts.get(iteration)
        if held is not None:
            return held
        log_probs, latents = read_rollout(self.store, stage_name(iteration, "rollout"))
        return RolloutOutput(iteration, self.trajectory_of(log_probs, latents), {})

    def trajectory_of(self, log_probs: np.ndarray, latents: np.ndarray) -> Trajectory:
        """A rollout's stored arrays as the trainer's trajectory, on this config's step grid."""
        sampler = self.config.sampler
        return Trajectory(torch.from_numpy(latents).float(), torch.from_numpy(log_probs).float(),
                          step_grid(sampler, schedule=schedule_of(self.policy, sampler)).sigmas,
                          trainable_steps(sampler))


def on_host(state):
    """A copy of a (nested) state dict whose tensors are all on the host."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: on_host(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_host(v) for v in state)
    return state


_CONTEXTS_LOCK = threading.Lock()


def context(config: RunConfig, store: RunStore) -> WorkerContext:
    """This worker's context of the run (``config`` at ``store``), made on first use and kept
    in the worker's runtime."""
    key = f"{store.url}|{config_hash(config.to_dict())}"
    contexts: dict[str, WorkerContext] = runtime().slot("run-contexts", dict)
    with _CONTEXTS_LOCK:
        ctx = contexts.get(key)
        if ctx is None:
            ctx = contexts[key] = WorkerContext(config, store)
        return ctx


def prepared_base(config: RunConfig, progress: bool = False) -> Policy:
    """The run's base policy (weights version 0) and its reward's cached parts, made in this
    process (the driver's, or an in-process run's) in the one order every run makes them: the
    recogniser trains with the thread count pretraining left, so where both are made first
    they come out the same whoever makes them."""
    base = base_policy(config, progress=progress)   # digits: pretrained, cached
    build_reward(config.reward)                      # the recogniser cached once, here
    return base


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
    return {"rewards": rewards, "record": task_record("reward", rollout.iteration, start, version)}


def advantages_task(config: RunConfig, iteration: int, rewards: np.ndarray, version: int) -> dict:
    start = time.time()
    grpo = config.grpo
    adv = group_advantages(rewards, global_std=grpo.global_std, clip=grpo.adv_clip_max)
    return {"values": adv.values, "kept": adv.kept, "group_std": adv.group_std,
            "record": task_record("advantages", iteration, start, version)}


def training_batch(rollout: RolloutOutput, request: TrainRequest) -> tuple[Rollout, Advantages]:
    """What a trainer steps on: the rollout's samples, each with its prompt, and their
    advantages."""
    group = request.rewards.shape[1]
    flat = [p for p in request.prompts for _ in range(group)]
    adv = request.advantages
    return (Rollout(flat, [], rollout.trajectory, np.empty(0), request.rewards),
            Advantages(adv["values"], adv["kept"], adv["group_std"]))


def train_task(config: RunConfig, store: RunStore, rollout: RolloutOutput,
               request: TrainRequest, peers=None) -> dict:
    """One Flow-GRPO update θ_version -> θ_version+1; returns the new state for the checkpoint.
    With data-parallel ``peers`` (:mod:`pipelines.parallel.training`) this worker computes its
    share and every peer takes the same step."""
    start, version = time.time(), request.version
    ctx = context(config, store)
    with ctx.lock:
        trainer = ctx.trainer_at(version)
        trainer.peers = peers
        try:
            stats = trainer.train(*training_batch(rollout, request), rollout.iteration)
        except BaseException:
            ctx.version = ctx.trainer_version = None   # a step cut half-way: reload to retry
            raise
        finally:
            trainer.peers = None
        ctx.version = ctx.trainer_version = version + 1
        # On the host: the result travels to the checkpoint writer and the driver, which need
        # no GPU (and would hold a CUDA context in every process that unpickled it).
        weights = on_host(trainer.policy.state_dict())
        optimizer_state = on_host(trainer.training_state())
    info = {} if peers is None else {"data_parallel": peers.world}
    return {"weights": weights, "optimizer_state": optimizer_state, "stats": stats,
            "record": task_record("train", rollout.iteration, start, version, **info)}


def checkpoint_task(config: RunConfig, store: RunStore, trained: dict, iteration: int,
                    version: int) -> dict:
    """Write θ_version+1 (weights and optimizer state) to the run store; the returned
    ``checkpoint`` record is committed by the driver, the manifest's only writer."""
    start = time.time()
    saved = store.write_checkpoint(version + 1, trained["weights"], trained["optimizer_state"],
                                   metadata={"trained_in_iteration": iteration,
                                             **trained.get("checkpoint_metadata", {})})
    return {"stats": trained["stats"], "checkpoint": saved,
            "records": [trained["record"],
                        task_record("checkpoint", iteration, start, version + 1)]}


def explore_task(config: RunConfig, store: RunStore, request: ExploreRequest,
                 attempt: Attempt = FIRST) -> Explored | HandedBack:
    """Score candidate seeds of one prompt by replaying the rollout's SDE sampler (see
    :class:`ExploreRequest`). One call is one attempt of one request of fixed batch shape."""
    steps = request.steps or config.exploration.steps or config.sampler.num_steps
    seeds, prompt = np.asarray(request.seeds), request.prompt
    where = StreamedRequest(request.name, request.version, request.stage, request.iteration,
                            Attempt(*attempt))

    def score(run: RequestRun) -> Explored:
        keys = sample_keys(config.seed, [prompt], seeds[None, :])
        traj = run.sample([prompt.text] * len(seeds), seeds, keys, num_steps=steps)
        images = run.policy.decode(traj.final)
        rewards = np.asarray(run.ctx.reward_fn(images, [prompt] * len(seeds)), dtype=np.float64)
        check_rewards(rewards, "exploration")
        if config.objective.train_on_explored and request.stage in STAGES_WITH_SAMPLES:
            store.put_arrays(stage_name(request.iteration, request.stage),
                             explored_samples(request.name),
                             {"prompt_index": request.prompt_index, "seeds": seeds,
                              "final": traj.final.float().cpu().numpy()})
        return Explored(request.prompt_index, request.chunk, seeds, rewards, run.record(
            prompt_index=request.prompt_index, chunk=request.chunk, samples=len(seeds),
            steps=steps, text_encoder=bool(getattr(run.policy, "text_encoder_loaded", False))))

    return run_streamed_request(context(config, store), where, score)


def validation_task(config: RunConfig, store: RunStore, iteration: int, prompts: list[Prompt],
                    version: int) -> dict:
    """Deterministic ODE validation of weights ``version`` on held-out prompts."""
    start = time.time()
    ctx = context(config, store)
    with ctx.lock:
        result = validate(ctx.policy_at(version), prompts, ctx.reward_fn, check_rewards, config)
    return {"mean_reward": result.mean_reward, "rewards": result.rewards,
            "prompts": result.prompts, "images": result.images.astype(np.float16),
            "record": task_record("validation", iteration, start, version)}
