"""Process groups that coexist in one process: an SP group and a training group at once.

torch.distributed keeps one *default* group per process, and much of it -- ``DeviceMesh``,
FSDP2's mesh, ``torch.distributed.checkpoint`` -- asks the default group for "this process's
rank". A Spotlight gpu worker can be in an SP rollout group (the default group, formed anew at
each membership epoch) and in the training group at once. So the training group is made the way
``init_process_group`` makes a default group -- registered with c10d, so a ``DeviceMesh`` can be
built over it and functional collectives resolve it by name -- and then put aside, and made the
default only around the code that needs it (:func:`as_default`; a worker runs one task at a
time, so nothing else sees the swap).

A group is closed by :func:`close_group` alone: ``destroy_process_group()`` on the default group
shuts down *every* registered group of the process, which would take the other one with it.
"""
from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def open_group(backend: str, store: dist.Store, rank: int, world: int, name: str,
               timeout: timedelta, device: torch.device | None = None, *,
               default: bool = False) -> dist.ProcessGroup:
    """A registered group of ``backend`` ('gloo' or 'nccl') over ``store``, as ``rank`` of
    ``world``. ``name``: the same on every member, and unique in this process. ``device``: the
    CUDA device a NCCL group binds to. ``default``: it becomes the default group (there must be
    none); otherwise the current default group stays the default."""
    held = c10d._world.default_pg
    c10d._update_default_pg(None)   # init_process_group makes a group only where none is default
    try:
        # init_process_group names a group -- and prefixes its keys in the store -- by a count
        # of the groups this process has made, which differs between members that made
        # different numbers (their keys never meet: the join hangs). Named from ``name``, the
        # group has the same keys on every member.
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timeout, _ranks=list(name.encode()),
                                device_id=_bound(device) if backend == "nccl" else None)
        return c10d._world.default_pg
    finally:
        if not default:
            c10d._update_default_pg(held)


def _bound(device: torch.device | None) -> torch.device | None:
    """The indexed CUDA device a NCCL group binds to ('cuda' alone: the current one, which a
    worker of a multi-GPU node has pinned)."""
    if device is None or device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda",
                                                                 torch.cuda.current_device())


def close_group(group: dist.ProcessGroup | None, abort: bool = False) -> None:
    """Shut ``group`` down and drop c10d's references to it, leaving every other group as it
    was. ``abort``: it failed mid-collective (what frees a NCCL communicator's peers).

    A gloo group's connections close only when the object is freed (torch 2.13), and some
    references to it are cyclic: the caller drops its own and runs ``gc.collect()`` after, so
    that a peer blocked on this member fails at once instead of waiting out its timeout."""
    if group is None or group not in c10d._world.pg_map:
        return
    if abort:
        try:
            group.abort()
        except (RuntimeError, NotImplementedError):   # a backend without abort
            pass
    if c10d._world.default_pg is group:
        c10d._update_default_pg(None)
    dist.destroy_process_group(group)   # not the default any more: this group alone


@contextmanager
def as_default(group: dist.ProcessGroup) -> Iterator[dist.ProcessGroup]:
    """``group`` is the default group inside (the one ``dist.get_rank()`` and the libraries
    built on it ask), whatever was before."""
    held = c10d._world.default_pg
    c10d._update_default_pg(group)
    try:
        yield group
    finally:
        c10d._update_default_pg(held)

