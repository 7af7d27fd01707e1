"""Data-parallel training on the gpu workers' persistent executors.

Every gpu worker trains the same Flow-GRPO step on its share of each micro-batch; the gradients
(and the step's statistics) are summed over the group before the optimizer step, so every member
takes the single-process step and ends holding the new weights in its worker context -- the
next rollout copies nothing (:class:`~spotlight.rl.trainer.FlowGRPO`'s ``peers``).

The group's communicator is a process group of its own on a rendezvous hosted by rank 0 --
NCCL where the model computes on CUDA, gloo on the CPU
(:func:`~spotlight.models.device.collective_backend`) -- beside the default group an
executor's SP group uses, so a gpu worker can be in an SP rollout group and the training group
at once. The driver's :class:`TrainingGroup` forms it over the live gpu workers and forms it
anew when they change: a member lost mid-step fails its peers' collectives, and the step is run
again from the stored version on the rebuilt group.
"""
from __future__ import annotations

import gc
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pipelines.cluster.runtime import runtime
from pipelines.parallel.executor import JOIN_TIMEOUT, STEP_TIMEOUT, _own_host
from pipelines.parallel.groups import ExecutorGone, await_pinned
from spotlight.models.device import collective_backend, resolve_device
from spotlight.parallel.buckets import DEFAULT_BUCKET_BYTES, gradient_buckets
from spotlight.parallel.process_groups import close_group, open_group


@dataclass
class GroupPeers:
    """This process's place in the training group
    (:class:`~spotlight.rl.trainer.DataParallelPeers`)."""

    group: object
    rank: int
    world: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    sharded: bool = False   # the gradients are whole on every member (data-parallel)

    def all_reduce(self, tensors: list[torch.Tensor]) -> None:
        """Sum every tensor over the group in place: one collective per bucket (tensors of one
        dtype, in order, up to ``bucket_bytes``, flattened), so the extra memory is one bucket,
        not a second copy of every gradient."""
        plan = gradient_buckets([t.numel() * t.element_size() for t in tensors],
                                [t.dtype for t in tensors], self.bucket_bytes)
        for indices in plan:
            same = [tensors[i] for i in indices]
            flat = torch.cat([t.reshape(-1) for t in same])
            with leaving_on_error(self):
                self.group.allreduce([flat]).wait()
            offset = 0
            for t in same:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def leave(self) -> None:
        """Leave the group at once (a collective failed): a peer blocked on this member fails
        too instead of waiting out the timeout, and the driver forms the group anew. Only the
        communicator's destruction closes its connections (abort does not), and the error Dask
        keeps holds this object: the reference goes here."""
        seat().peers.clear()
        group, self.group = self.group, None
        close_group(group, abort=True)
        del group
        gc.collect()


@contextmanager
def leaving_on_error(peers: GroupPeers):
    """Collectives of ``peers``' group inside (a bucket's all-reduce, a whole sharded step): if
    anything fails, this member leaves the group at once (:meth:`GroupPeers.leave`), so a peer
    blocked on it fails too, and the error's frames let go of what holds the group."""
    try:
        yield
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)
        peers.leave()
        raise


# --- executor side (tasks pinned to one worker) ------------------------------------------------
@dataclass
class TrainingSeat:
    """This worker's part in the training groups (a slot of its runtime)."""

    hosted: dict[int, dist.TCPStore] = field(default_factory=dict)   # epoch -> rendezvous it hosts
    peers: dict[int, GroupPeers] = field(default_factory=dict)        # epoch -> its place in it


def seat() -> TrainingSeat:
    return runtime().slot("training-seat", TrainingSeat)


def open_training_rendezvous(epoch: int) -> tuple[str, int]:
    host, hosted = _own_host(), seat().hosted
    hosted.clear()   # an older group's rendezvous is not needed any more
    hosted[epoch] = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                  timeout=JOIN_TIMEOUT)
    return host, hosted[epoch].port


def communicator(device: torch.device, store, rank: int, world: int,
                 name: str) -> dist.ProcessGroup:
    """A process group named ``name`` on ``store`` for tensors on ``device`` (NCCL on CUDA,
    gloo on the CPU), registered with c10d but not the default group (an SP group may be); a
    step's collective may wait ``STEP_TIMEOUT``."""
    group = open_group(collective_backend(device), store, rank, world, name, JOIN_TIMEOUT,
                       device)
    dist.distributed_c10d._set_pg_timeout(STEP_TIMEOUT, group)   # joined: may wait longer
    return group


def join_training(epoch: int, rank: int, world: int, host: str, port: int,
                  device: str = "cpu") -> float:
    """Join training group ``epoch`` as ``rank`` of ``world``, its collectives over tensors on
    ``device`` (``model.device``, resolved on this worker); the seconds it took."""
    started, mine = time.perf_counter(), seat()
    store = mine.hosted[epoch] if rank == 0 else dist.TCPStore(host, port, is_master=False,
                                                               timeout=JOIN_TIMEOUT)
    for older in mine.peers.values():   # an older group's connections close now
        close_group(older.group)
    mine.peers.clear()
    gc.collect()
    # Epochs count from 1 again under a new driver: the rendezvous makes the name unique.
    group = communicator(resolve_device(device), dist.PrefixStore(f"train-{epoch}", store),
                         rank, world, name=f"train-{epoch}-{host}:{port}")
    mine.peers[epoch] = GroupPeers(group, rank, world)
    return time.perf_counter() - started


def peers(epoch: int) -> GroupPeers:
    joined = seat().peers
    if epoch not in joined:
        raise RuntimeError(f"executor is not in training group {epoch} (it is in "
                           f"{list(joined) or 'none'}): form the group first")
    return joined[epoch]


def group_size(epoch: int) -> int:
    """The members of training group ``epoch`` counted by an all-reduce (a health check: it
    answers only when every member is there)."""
    ones = torch.ones(1)
    peers(epoch).all_reduce([ones])
    return int(ones.item())


# --- driver side --------------------------------------------------------------------------------
class TrainingGroup:
    """The training communicator over the gpu workers, formed anew when they change."""

    def __init__(self, client, device: str = "cpu") -> None:
        self.client, self.device = client, device   # model.device, as each worker resolves it
        self.members: tuple[str, ...] = ()
        self.epoch = 0
        self.log: list[dict] = []

    def ensure(self, members: list[str]) -> None:
        """Be formed over ``members`` (in rank order)."""
        if tuple(members) == self.members:
            return
        started = time.perf_counter()
        self.epoch += 1
        pinned = set(members)
        place = await_pinned(self.client, [self.client.submit(
            open_training_rendezvous, self.epoch, workers=[members[0]], pure=False,
            allow_other_workers=False)], pinned)[0]
        joins = [self.client.submit(join_training, self.epoch, rank, len(members), *place,
                                    self.device, workers=[m], pure=False,
                                    allow_other_workers=False)
                 for rank, m in enumerate(members)]
        await_pinned(self.client, joins, pinned)
        self.members = tuple(members)
        self.log.append({"action": "form-training", "members": list(members),
                         "s": time.perf_counter() - started})

    def run(self, members, fn, *args, attempts: int = 3):
        """``fn(epoch, *args)`` on every member at once; rank 0's result. A member lost
        meanwhile: the group is formed anew over whoever ``members()`` lists then, and ``fn``
        runs again (up to ``attempts`` times)."""
        for attempt in range(attempts):
            current = members()
            try:
                self.ensure(current)
                futures = [self.client.submit(fn, self.epoch, *args, workers=[m], pure=False,
                                              allow_other_workers=False) for m in current]
                return await_pinned(self.client, futures, set(current))[0]
            except ExecutorGone as gone:
                self.log.append({"action": "lost", "executor": gone.address,
                                 "attempt": attempt + 1})
                self.members = ()   # formed anew next time, without it
        raise RuntimeError(f"data-parallel training lost a member in each of {attempts} "
                           f"attempts ({self.log[-attempts:]}); the gpu workers keep dying")
