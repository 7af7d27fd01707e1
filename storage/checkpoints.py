"""Checkpoints: safetensors files whose sha256 is recorded in manifest.json after the data.

Layout: ``checkpoints/iter-000012/weights.safetensors`` and, with an optimizer,
``optimizer.safetensors`` (its tensors flattened to dotted names, the non-tensor structure as
JSON in the safetensors metadata) -- or, trained sharded, ``optimizer-shards/`` (a
``torch.distributed.checkpoint`` folder, named in the record's metadata). Nothing is
unpickled: safetensors holds raw tensors and JSON.

A checkpoint exists only once its manifest record exists, so an interrupted write never becomes
the latest; re-saving an iteration first withdraws its old record. Loading verifies every
file's sha256 before parsing it and names the object that fails.
"""
from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import CorruptObjectError, NotCommittedError
from .manifest import Manifest, iteration_dir
from .urls import RunLocation

WEIGHTS = "weights.safetensors"
OPTIMIZER = "optimizer.safetensors"
# Sharded training's optimizer state: one torch.distributed.checkpoint folder that every member
# of the training group writes its shards to (pipelines/run/sharded_train.py).
OPTIMIZER_SHARDS = "optimizer-shards"
_META_KEY = "spotlight"


@dataclass
class Checkpoint:
    """A loaded checkpoint."""

    iteration: int
    weights_version: int
    weights: dict[str, Any]
    """Parameter name -> torch.Tensor."""
    optimizer_state: Any | None
    """The optimizer ``state_dict()`` as saved (None if none was saved)."""
    metadata: dict = field(default_factory=dict)


# -- optimizer state <-> flat tensors + JSON skeleton -------------------------------------------
def flatten_state(state: Any) -> tuple[dict[str, Any], Any]:
    """Split a nested state (e.g. ``optimizer.state_dict()``) into named tensors and a JSON
    skeleton that refers to them; :func:`unflatten_state` inverts it exactly (int keys kept)."""
    import torch

    tensors: dict[str, Any] = {}

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            name = path or "tensor"
            tensors[name] = obj
            return {"__tensor__": name}
        if isinstance(obj, Mapping):
            items = []
            for k, v in obj.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"state key {k!r} at '{path}' must be str or int")
                items.append([k, walk(v, f"{path}.{k}" if path else str(k))])
            return {"__dict__": items}
        if isinstance(obj, tuple):
            return {"__tuple__": [walk(v, f"{path}.{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(obj)]
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"state value at '{path}' has type {type(obj).__name__}; only tensors, "
                        "dicts, lists, tuples and JSON scalars can be checkpointed")

    return tensors, walk(state, "")


def unflatten_state(skeleton: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(skeleton, list):
        return [unflatten_state(v, tensors) for v in skeleton]
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__tuple__" in skeleton:
            return tuple(unflatten_state(v, tensors) for v in skeleton["__tuple__"])
        return {k: unflatten_state(v, tensors) for k, v in skeleton["__dict__"]}
    return skeleton


def _to_safetensors(tensors: Mapping[str, Any], meta: dict) -> bytes:
    from safetensors.torch import save

    seen: dict[int, str] = {}
    out = {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:  # safetensors refuses shared storage (tied weights)
            t = t.clone()
        elif ptr is not None:
            seen[ptr] = name
        out[name] = t
    return save(out, metadata={_META_KEY: json.dumps(meta, sort_keys=True)})


def _safetensors_meta(data: bytes, url: str) -> dict:
    """The JSON we stored in a safetensors header (parsed by hand: no pickle, no torch)."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n].decode("utf-8"))
        return json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
    except Exception as exc:  # noqa: BLE001 - any parse failure means a bad file
        raise CorruptObjectError(url, f"unreadable safetensors header ({exc})") from exc


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class CheckpointStore:
    """Save, list and load the run's checkpoints."""

    def __init__(self, location: RunLocation, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest

    def _parts(self, iteration: int, name: str) -> tuple[str, str, str]:
        return "checkpoints", iteration_dir(iteration), name

    def shards_url(self, iteration: int) -> str:
        """The folder of checkpoint ``iteration``'s optimizer shards (sharded training)."""
        return self.location.child_url(*self._parts(iteration, OPTIMIZER_SHARDS))

    def save(self, iteration: int, weights: Mapping[str, Any], optimizer_state: Any = None, *,
             weights_version: int | None = None, metadata: dict | None = None) -> dict:
        """Write weights (and optimizer state), then record their sha256 in the manifest.

        Returns the manifest record. ``weights_version`` defaults to ``iteration``.
        """
        self.withdraw(iteration)
        record = self.write(iteration, weights, optimizer_state, weights_version=weights_version,
                            metadata=metadata)
        return self.commit(record)

    def withdraw(self, iteration: int) -> None:
        """Drop the manifest record of ``iteration`` (before its files are overwritten: a
        half-overwritten checkpoint must not stay "latest")."""
        key = iteration_dir(iteration)
        if key in self.manifest.read().get("checkpoints", {}):
            self.manifest.update(lambda m: m["checkpoints"].pop(key, None))

    def write(self, iteration: int, weights: Mapping[str, Any], optimizer_state: Any = None, *,
              weights_version: int | None = None, metadata: dict | None = None) -> dict:
        """Write the files of a checkpoint and return its record -- not yet committed: the
        manifest's writer commits it (:meth:`commit`), so a worker never writes the manifest."""
        version = iteration if weights_version is None else int(weights_version)
        meta = {"iteration": iteration, "weights_version": version, "metadata": metadata or {}}
        files = {WEIGHTS: _to_safetensors(weights, meta)}
        if optimizer_state is not None:
            tensors, skeleton = flatten_state(optimizer_state)
            files[OPTIMIZER] = _to_safetensors(tensors, {**meta, "skeleton": skeleton})
        for name, data in files.items():
            self.location.write_bytes(data, *self._parts(iteration, name))
        return {"iteration": iteration, "weights_version": version, "saved_at":
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "metadata": metadata or {},
                "files": {n: {"sha256": _sha256(d), "bytes": len(d)} for n, d in files.items()}}

    def commit(self, record: dict) -> dict:
        """Record a written checkpoint in the manifest: from now on it exists."""
        key = iteration_dir(int(record["iteration"]))
        self.manifest.update(lambda m: m.setdefault("checkpoints", {}).__setitem__(key, record))
        return record

    def iterations(self) -> list[int]:
        """Iterations with a committed checkpoint, ascending."""
        records = self.manifest.read().get("checkpoints", {})
        return sorted(int(r["iteration"]) for r in records.values())

    def latest(self) -> int | None:
        """The newest committed checkpoint's iteration, or None."""
        its = self.iterations()
        return its[-1] if its else None

    def record(self, iteration: int) -> dict:
        rec = self.manifest.read().get("checkpoints", {}).get(iteration_dir(iteration))
        if rec is None:
            raise NotCommittedError(
                f"no committed checkpoint for iteration {iteration} in {self.location.url} "
                f"(committed: {self.iterations() or 'none'})")
        return rec

    def read_verified(self, iteration: int, name: str) -> bytes:
        """The bytes of one checkpoint file, after checking size and sha256 against the record."""
        rec = self.record(iteration)
        parts = self._parts(iteration, name)
        url = self.location.child_url(*parts)
        expected = rec["files"].get(name)
        if expected is None:
            raise NotCommittedError(f"checkpoint {iteration} has no {name} (files: "
                                    f"{sorted(rec['files'])})")
        try:
            data = self.location.read_bytes(*parts)
        except FileNotFoundError as exc:
            raise CorruptObjectError(url, "recorded in the manifest but missing") from exc
        got = _sha256(data)
        if len(data) != expected["bytes"] or got != expected["sha256"]:
            raise CorruptObjectError(url, f"sha256 {got[:16]}... ({len(data)} bytes) does not "
                                     f"match the manifest's {expected['sha256'][:16]}... "
                                     f"({expected['bytes']} bytes); do not use this checkpoint")
        return data

    def load(self, iteration: int | None = None, *, device: str = "cpu") -> Checkpoint:
        """Load a checkpoint (default: the latest committed), verifying every hash first."""
        from safetensors.torch import load

        if iteration is None:
            iteration = self.latest()
            if iteration is None:
                raise NotCommittedError(f"no committed checkpoint in {self.location.url}")
        rec = self.record(iteration)
        weights_bytes = self.read_verified(iteration, WEIGHTS)
        weights = {k: v.to(device) for k, v in load(weights_bytes).items()}
        optimizer_state = None
        if OPTIMIZER in rec["files"]:
            data = self.read_verified(iteration, OPTIMIZER)
            url = self.location.child_url(*self._parts(iteration, OPTIMIZER))
            skeleton = _safetensors_meta(data, url).get("skeleton")
            optimizer_state = unflatten_state(skeleton,
                                              {k: v.to(device) for k, v in load(data).items()})
        return Checkpoint(iteration=iteration, weights_version=int(rec["weights_version"]),
                          weights=weights, optimizer_state=optimizer_state,
                          metadata=dict(rec.get("metadata", {})))
