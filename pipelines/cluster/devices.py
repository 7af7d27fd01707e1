"""One accelerator per worker process on a node with several.

A node with 8 GPUs runs 8 worker processes (``dask worker --nworkers 8``, a SLURM job with
``--gres=gpu:8``, a pod with several GPUs). Each sees all 8 devices, and ``cuda`` means device 0
to every one of them: without a choice they would all compute on GPU 0. The worker set-up
(:mod:`pipelines.cluster.worker_setup`) therefore claims one device per process, whichever way the
node was started: the first of the node's devices whose lock file no live process holds (an
exclusive ``flock`` on ``<tmp>/spotlight-devices-<visible>/device-<i>.lock``), and makes it the
process's current CUDA device. The kernel drops a lock when its process dies, SIGKILL included,
so a restarted worker takes the device its predecessor left.

Where a launcher already gives each process a device of its own (``CUDA_VISIBLE_DEVICES`` with
one entry, as SLURM's ``--gpus-per-task=1`` or a Kubernetes pod with one GPU), a process sees
one device and there is nothing to share out. The lock folder is named after the visible set,
so processes that see different devices never compete for a lock.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DeviceSlot:
    """The device a worker process claimed: ``index`` of the node's ``count``."""

    index: int
    count: int


_held: DeviceSlot | None = None   # this process's claim, for its lifetime
_held_fd: int | None = None


def lock_folder(visible: str | None = None) -> Path:
    """Where the node's device locks lie: one folder per set of visible devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    tag = "".join(c if c.isalnum() else "_" for c in visible) or "all"
    return Path(tempfile.gettempdir()) / f"spotlight-devices-{tag}"


def claim_device_slot(count: int, folder: Path | None = None) -> DeviceSlot | None:
    """The first of ``count`` device slots that no other live process of this node holds,
    held by this process until it exits; the one it holds already, if it claimed before. None
    when every slot is held (more worker processes than devices)."""
    global _held, _held_fd
    if count < 1:
        raise ValueError(f"claim_device_slot: count {count}: a node has at least one device")
    if _held is not None and _held.count == count:
        return _held
    folder = lock_folder() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = folder / f"device-{index}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())   # who holds it, for a person looking
        if _held_fd is not None:
            os.close(_held_fd)
        _held, _held_fd = DeviceSlot(index, count), fd
        return _held
    return None


def held_device_slot() -> DeviceSlot | None:
    """The slot this process claimed, if any."""
    return _held


def node_device_count(configured: int) -> int:
    """The devices a node shares out among its worker processes: ``cluster.devices_per_node``
    when set, else the CUDA devices this process sees (0 on a CPU node)."""
    if configured:
        return configured
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pin_worker_device(count: int) -> DeviceSlot | None:
    """Claim one of the node's ``count`` devices for this worker process and make it the
    current CUDA device (where there is CUDA); None when every device is taken."""
    slot = claim_device_slot(count)
    if slot is not None:
        import torch

        if torch.cuda.is_available() and slot.index < torch.cuda.device_count():
            torch.cuda.set_device(slot.index)
    return slot
