"""Run store: a Spotlight run on object storage (file://, memory://, s3://) through fsspec.

Knows numpy, zarr, xarray and fsspec (torch only inside checkpoint save/load); nothing of
Dask or the RL. Start at :class:`RunStore`::

    store = RunStore.open("s3://bucket/runs/r1", endpoint_url="http://127.0.0.1:9000")
    with store.latent_sink("iter-3/rollout") as sink:
        sink.commit("p07-s2", step, latent, num_steps=10, weights_version=3)
    store.mark_stage_done("iter-3/rollout", {"requests": 64})
"""
from __future__ import annotations

from .checkpoints import Checkpoint, CheckpointStore
from .config import StorageConfig
from .errors import (
    CorruptObjectError,
    NotCommittedError,
    SinkClosedError,
    StorageError,
    StoragePermanentError,
    StorageUnavailableError,
    StreamOvertakenError,
)
from .latents import LatentStreams, ResumePoint
from .manifest import Manifest, iteration_dir, stage_iteration, stage_key
from .prompts import PromptEmbeddings
from .rewards import RewardTable
from .run import RunStore
from .sink import LatentSink

__all__ = [
    "Checkpoint", "CheckpointStore", "CorruptObjectError", "LatentSink", "LatentStreams",
    "Manifest", "NotCommittedError", "PromptEmbeddings", "ResumePoint", "RewardTable", "RunStore",
    "SinkClosedError",
    "StorageConfig", "StorageError", "StoragePermanentError", "StorageUnavailableError",
    "StreamOvertakenError", "iteration_dir",
    "stage_iteration", "stage_key",
]
