"""Persistent SP executors: the Dask worker processes themselves, holding a model between tasks.

Each function here runs as a task pinned to one worker. The executor's state (the model, its
weights version, the process group it is in and the rendezvous it hosts) lives in the worker's
runtime (:mod:`pipelines.cluster.runtime`) from task to task -- so a group that loses a member
is rebuilt by the survivors without reloading anything: a new process group over a new
rendezvous, the weights copied to a newcomer from a peer (through the node's shared memory, or
over the network from another node), the same model object with its attention processors
swapped (:mod:`spotlight.parallel.ulysses`).

A process is in at most one group at a time, so the group is torch.distributed's default
group, destroyed and initialised again at each membership epoch.

An executor holds one of two things, named by the ``spec`` its tasks carry: a run's policy
(``{"run": (config, store)}``): the worker's :class:`~pipelines.run.tasks.WorkerContext`, which
the pipeline's other tasks on that worker share -- so its weights version is the context's, and
the group's attention is switched on only around an SP request
(:func:`spotlight.parallel.ulysses.sequence_parallel`); or a model of its own that the spec
builds (``{"build": fn, ...}``, ``fn(spec)`` returns the module: a benchmark's bare
transformer, :mod:`pipelines.bench.sp`).
"""
from __future__ import annotations

import gc
import os
import socket
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pipelines.cluster.runtime import runtime
from pipelines.run import tasks
from spotlight.models.device import collective_backend, module_device
from spotlight.parallel import ulysses
from spotlight.parallel.process_groups import close_group, open_group
from storage import RunStore

# A join completes in milliseconds; a member that died before joining must not hold the
# others (each a worker's only thread) for long.
JOIN_TIMEOUT = timedelta(seconds=15)
# Once joined, how long a member waits for a peer in one collective. A peer that is busy --
# still loading a version, finishing another task of its worker -- is slow, not lost; a lost
# peer is seen at once, by its reset connection, not by this timeout.
STEP_TIMEOUT = timedelta(minutes=10)
# Node-local shared memory (tmpfs) where it exists; the temp folder otherwise.
SHARED_DIR = (Path("/dev/shm") if Path("/dev/shm").is_dir()
              else Path(os.environ.get("TMPDIR", "/tmp")))


@dataclass
class ExecutorState:
    model: torch.nn.Module | None = None
    version: int | None = None
    epoch: int | None = None
    rendezvous: dist.TCPStore | None = None
    run: bool = False           # holds a run's policy (its context's), not a bare transformer


def state() -> ExecutorState:
    """This worker's executor: its slot in the worker's runtime."""
    return runtime().slot("sp-executor", ExecutorState)


class WeightsNotHeldError(RuntimeError):
    """This executor was asked for (or to serve) a weights version it does not hold -- its
    process was restarted, or a copy to it failed silently. The driver copies again
    (:class:`spotlight.parallel.membership.WeightsNotHeld`); ``holds`` is what it has."""

    def __init__(self, holds: int | None, wanted: int | None, doing: str) -> None:
        super().__init__(f"executor holds weights version {holds}, {doing} {wanted}")
        self.holds, self.wanted, self.doing = holds, wanted, doing

    def __reduce__(self):   # it crosses from the worker to the driver
        return type(self), (self.holds, self.wanted, self.doing)


def _install(spec: dict, weights, version: int) -> dict:
    """Take ``weights()`` (a state dict) as ``version``, building the model first if this
    process has none; the seconds of each part."""
    st = state()
    started = time.perf_counter()
    if "run" in spec:
        return _install_run(spec, weights, version, started)
    st.model = st.model or spec["build"](spec)
    built = time.perf_counter()
    st.model.load_state_dict(weights())
    st.version = version
    return {"build_s": built - started, "load_s": time.perf_counter() - built}


def run_context(spec: dict):
    """The worker's context of the run a ``{"run": (config, store)}`` spec names."""
    return tasks.context(*spec["run"])


def _install_run(spec: dict, weights, version: int, started: float) -> dict:
    st, ctx = state(), run_context(spec)
    built = time.perf_counter()
    with ctx.lock:
        if ctx.version != version:   # the trainer's worker may hold it already
            ctx.policy.load_state_dict(weights())
            ctx.version, ctx.trainer_version = version, None
        st.model, st.version, st.run = ctx.policy, version, True
    return {"build_s": built - started, "load_s": time.perf_counter() - built}


def _state_dict(spec: dict | None, version: int | None) -> dict:
    """The weights this executor holds -- for a run, those of ``version`` (other tasks on the
    worker may have moved its context to another version since)."""
    st = state()
    if spec is None or "run" not in spec:
        if version is not None and st.version != version:
            raise WeightsNotHeldError(st.version, version, "a peer asked to copy version")
        return st.model.state_dict()
    ctx = run_context(spec)
    with ctx.lock:
        return {k: v.detach().clone() for k, v in ctx.policy_at(version).state_dict().items()}


def load_from_store(spec: dict, url: str, version: int) -> dict:
    """Load ``version``'s weights from the run store (a cold start)."""

    return _install(spec, lambda: RunStore.open(url, create=False).load_checkpoint(
        version).weights, version)


def open_rendezvous() -> tuple[str, int]:
    """Host a new rendezvous for a group this executor will be rank 0 of: (host, port)."""
    st = state()
    host = _own_host()
    st.rendezvous = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                     timeout=JOIN_TIMEOUT)
    return host, st.rendezvous.port


def join(epoch: int, rank: int, world: int, host: str, port: int, version: int) -> dict:
    """Leave the current group and form group ``epoch`` as ``rank`` of ``world`` (every member
    must hold ``version`` already). Returns the seconds it took."""
    st = state()
    if st.version != version:   # the driver asked what it holds just before: a bug
        raise WeightsNotHeldError(st.version, version, "the group it joins serves version")
    started = time.perf_counter()
    leave()
    store = st.rendezvous if rank == 0 else dist.TCPStore(
        host, port, is_master=False, timeout=JOIN_TIMEOUT)
    device = module_device(st.model)
    open_group(collective_backend(device), dist.PrefixStore(f"epoch-{epoch}", store), rank, world,
               f"sp-{epoch}-{host}:{port}", JOIN_TIMEOUT, device, default=True)
    dist.distributed_c10d._set_pg_timeout(STEP_TIMEOUT)   # joined: collectives may wait longer
    if not st.run:   # a run's policy is shared with other tasks: switched per request
        ulysses.enable(st.model, dist.group.WORLD)
    st.epoch = epoch
    return {"communicator_s": time.perf_counter() - started}


def leave(abort: bool = False) -> None:
    """Leave the current group, if any (its communicator is dropped, the model kept), closing
    its connections at once: a peer blocked on this member fails too instead of waiting
    :data:`STEP_TIMEOUT`. ``abort``: this member failed mid-collective.

    A gloo group's connections close when its process-group object is freed, not when it is
    aborted or destroyed (torch 2.13), and some references to it are cyclic: so the model's
    attention processors let go of it, and a collection frees it now rather than whenever the
    collector next runs (a peer hung for minutes, or not, depending on that)."""
    st = state()
    if dist.is_initialized():
        if st.model is not None and not st.run:
            ulysses.disable(st.model)
        # This group alone: a training group of the same process stays (destroying the
        # default group the usual way shuts down every group the process has).
        close_group(dist.group.WORLD, abort=abort)
        gc.collect()
    st.epoch = None


def share_weights(spec: dict | None = None, version: int | None = None) -> str:
    """Put this executor's weights (of ``version``, default the one it holds) in the node's
    shared memory, once per version; the file a peer on this node loads them from."""
    st = state()
    from safetensors.torch import save_file

    version = st.version if version is None else version
    path = SHARED_DIR / f"spotlight-weights-{os.getpid()}-v{version}.safetensors"
    for older in SHARED_DIR.glob(f"spotlight-weights-{os.getpid()}-v*.safetensors"):
        if older != path:   # shared memory is the node's RAM: one version per executor
            older.unlink(missing_ok=True)
    if not path.exists():
        tmp = path.with_suffix(".partial")
        save_file({k: v.contiguous() for k, v in _state_dict(spec, version).items()}, str(tmp))
        tmp.rename(path)
    return str(path)


def load_shared(spec: dict, path: str, version: int) -> dict:
    """Take the weights a peer on this node put in shared memory."""
    from safetensors.torch import load_file

    return _install(spec, lambda: load_file(path), version)


def export_weights(spec: dict | None = None, version: int | None = None) -> dict:
    """This executor's weights, for a peer on another node (Dask carries them over the
    network)."""
    return {k: v.clone() for k, v in _state_dict(spec, version).items()}


def load_weights(spec: dict, weights: dict, version: int) -> dict:
    return _install(spec, lambda: weights, version)


def forward(epoch: int, inputs: dict) -> torch.Tensor | None:
    """This member's part of one SP forward; rank 0 returns the whole output."""
    st = state()
    check_epoch(epoch)
    with breaks_on_error():
        out = ulysses.forward(st.model, dist.group.WORLD, **inputs)
    return out if dist.get_rank() == 0 else None


def holds() -> int | None:
    """The weights version this executor holds (None: none)."""
    return state().version


@contextmanager
def breaks_on_error():
    """Collectives of this member's group inside; if anything here fails (a peer lost, a bug
    on this member), the member leaves the group at once -- its peers, which may be blocked
    on it, fail too and the group is re-formed (a timeout would hold them for minutes)."""
    try:
        yield
    except BaseException as error:
        # The error's frames hold the group (a collective's argument), and Dask keeps the error
        # for the task: their locals go first, or the group would outlive leave().
        traceback.clear_frames(error.__traceback__)
        leave(abort=True)
        raise


def check_epoch(epoch: int) -> None:
    st = state()
    if st.epoch != epoch:
        raise RuntimeError(f"executor is in group epoch {st.epoch}, asked for {epoch}: "
                           "form the group first")


@dataclass(frozen=True)
class GroupMember:
    """This process's place in its group, for code that runs the same on every member and
    only lets rank 0 write (:func:`pipelines.run.streamed.sample_streamed`)."""

    rank: int

    @property
    def size(self) -> int:
        return dist.get_world_size()

    @property
    def leads(self) -> bool:
        return self.rank == 0

    @staticmethod
    def agree(value):
        """Rank 0's ``value``, on every member."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def _own_host() -> str:
    try:
        from distributed import get_worker

        return get_worker().address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    except (ImportError, ValueError):
        return socket.gethostbyname("localhost")
