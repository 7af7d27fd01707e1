"""Training sharded over every gpu worker (``parallel.shard_training``), with FSDP2.

Each iteration, every member of the training group (:mod:`pipelines.parallel.training`) takes
a training copy of its policy's transformer at the stored version, shards it over the group
(:mod:`spotlight.parallel.sharded`: each member holds ``1/world`` of the trained weights,
their gradients and AdamW's moments), loads its optimizer shards from the version's
checkpoint, and runs the trainer on its share of every micro-batch; the gradients are summed
by FSDP2's reduce-scatter, so the step is the data-parallel one. After the step the whole new
weights are gathered on every member -- its rollouts use them, as after a data-parallel step --
and the optimizer state goes to the run store as shards (a ``torch.distributed.checkpoint``
folder beside the checkpoint's weights, which rank 0's result carries as usual).

Nothing sharded outlives the step: the next one re-shards from the stored version, on however
many gpu workers there are then. So a member lost mid-step is handled as in data-parallel
training -- the group is formed anew over the ones left and the step runs again -- and a run
resumes on another number of gpu workers.
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pipelines.parallel import training
from pipelines.parallel.training import GroupPeers
from pipelines.run import tasks
from pipelines.run.context import StageContext
from pipelines.run.dp_train import on_training_group
from spotlight.parallel.process_groups import as_default
from spotlight.parallel.sharded import full_tensors, load_sharded, save_sharded, shard_module
from spotlight.rewards import check_rewards
from spotlight.rl.objectives import build_trainer
from storage.checkpoints import OPTIMIZER_SHARDS


@dataclass
class ShardedPeers(GroupPeers):
    """The training group as a sharded step sees it: FSDP2 has summed the sharded gradients
    already; only whole tensors (the step's statistics) are summed here."""

    sharded: bool = True

    def all_reduce(self, tensors: list[torch.Tensor]) -> None:
        super().all_reduce([t for t in tensors if not hasattr(t, "to_local")])


@contextmanager
def sharded_transformer(policy, group, param_dtype: torch.dtype | None):
    """``policy`` computing with a sharded training copy of its transformer inside; its own
    (whole) transformer is back in place after."""
    whole = policy.transformer
    student = copy.deepcopy(whole)
    shard_module(student, group, list(student.transformer_blocks), param_dtype)
    policy.transformer = student
    try:
        yield student
    finally:
        policy.transformer = whole


def sharded_train_task(epoch: int, config, store, request: tasks.TrainRequest) -> dict:
    """One member's part of the sharded step; what :func:`tasks.train_task` returns (the
    optimizer state: in the run store as shards)."""
    start, peers = time.time(), training.peers(epoch)
    ctx = tasks.context(config, store)
    sharded = ShardedPeers(peers.group, peers.rank, peers.world)
    with ctx.lock, training.leaving_on_error(peers), as_default(peers.group):
        rollout, version = ctx.rollout(request.iteration), request.version
        trainer = _trainer(ctx)
        ctx.policy_at(version)
        with sharded_transformer(ctx.policy, peers.group, None) as student:
            trainer.rebind_parameters()
            _load_moments(store, version, student, trainer.optimizer)
            trainer.peers = sharded
            try:
                stats = trainer.train(*tasks.training_batch(rollout, request),
                                      rollout.iteration)
            finally:
                trainer.peers = None
            trained = full_tensors(student.state_dict().items())   # gathered on every member
            save_sharded(student, trainer.optimizer, store.checkpoints.shards_url(version + 1),
                         store.storage_options, weights=False)
        ctx.policy.transformer.load_state_dict(trained)
        ctx.version, ctx.trainer_version = version + 1, None   # ctx.trainer's moments are old
        weights = tasks.on_host(ctx.policy.state_dict())
    return {"weights": weights, "optimizer_state": None, "stats": stats,
            "checkpoint_metadata": {"optimizer": OPTIMIZER_SHARDS, "sharded_over": peers.world},
            "record": tasks.task_record("train", rollout.iteration, start, version,
                                        sharded=peers.world)}


def _trainer(ctx: tasks.WorkerContext):
    """This worker's sharded trainer: made once, with the base weights, for its frozen KL
    reference (whole, as the unsharded trainer's); its parameters and optimizer are rebound
    to each step's sharded copy."""
    if ctx.sharded_trainer is None:
        ctx.policy_at(0)
        ctx.sharded_trainer = build_trainer(ctx.config, ctx.policy, ctx.reward_fn, check_rewards)
    return ctx.sharded_trainer


def _load_moments(store, version: int, student, optimizer) -> None:
    """The optimizer shards of ``version`` (none at version 0: a fresh optimizer)."""
    if version == 0:
        return
    checkpoint = store.checkpoints.record(version)
    if checkpoint.get("metadata", {}).get("optimizer") != OPTIMIZER_SHARDS:
        raise RuntimeError(
            f"checkpoint {version} of {store.url} was trained without parallel.shard_training: "
            "its optimizer state is whole, not sharded. Continue the run with "
            "parallel.shard_training: false, or start a new run with it on")
    load_sharded(student, optimizer, store.checkpoints.shards_url(version),
                 store.storage_options, weights=False)


def sharded_train(ctx: StageContext, request: tasks.TrainRequest) -> dict:
    """The sharded step on every gpu worker at once; rank 0's result."""
    return on_training_group(ctx, sharded_train_task, request)
