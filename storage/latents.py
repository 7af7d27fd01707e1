"""Latent streams: the latent of every denoising step of every request, in Zarr v3.

Layout of a stage ``iter-000012/rollout``; each request is a group that reads as one xarray
Dataset::

    iter-000012/rollout.zarr/latents/<request>/                 group (attrs: weights_version, ...)
    iter-000012/rollout.zarr/latents/<request>/latent           (step, sample, token, channel)
    iter-000012/rollout.zarr/latents/<request>/latent/c/<t>/... one chunk per step (crc32c)
    iter-000012/rollout.zarr/latents/<request>/latent-e1a2      steps of a later attempt
    iter-000012/rollout.zarr/latents/<request>/sigma, prompt, seed, weights_version  coordinates
    iter-000012/rollout.commits/<request>.json                  the commit marker

(The markers live outside the Zarr hierarchy, which holds only Zarr objects.)

Coordinates are whatever the writer labels the request with (:class:`Labels`); Spotlight's
sampler gives ``sigma`` per step and ``prompt`` and ``seed`` per sample. When a request's last
step is committed its group's metadata is consolidated, so a finished request opens with plain
xarray in one read::

    xarray.open_zarr(RUN_URL + "/iter-000012/rollout.zarr/latents/p0000")

Step 0 is the initial noise, step t the latent after t denoising steps. A step is committed
when the commit marker says so; the marker is written only after the chunk it covers, so a
half-written chunk is never taken for a committed one. The marker also owns the request: it
names the attempt writing it and which array holds which steps (:mod:`storage.attempts`). An
attempt that takes a request over writes its own array, so a request resumed by another attempt
reads whole with :meth:`LatentStreams.read_trajectory` (``latent`` alone ends where it was taken
over). Latents are stored bit-exactly (same
dtype, no lossy codec), which with the determinism contract makes a request resumed from
``resume_point`` produce the same output as one never interrupted.

:class:`storage.sink.LatentSink` moves the writes off the critical path.
"""
from __future__ import annotations

import json
import re
import warnings
from typing import Any, NamedTuple

import numpy as np

from .attempts import LATENT, Attempt, attempt_of, claimed, fenced_by, lineage_of, segments
from .conditional import create_exclusive, read_versioned, replace_if
from .errors import (
    CorruptObjectError,
    NotCommittedError,
    StorageError,
    StreamOvertakenError,
    WriteConflict,
)
from .manifest import stage_key
from .urls import RunLocation

COMMITS = ".commits"     # suffix of the stage's marker folder, beside its ``.zarr``
_CLAIM_TRIES = 5         # a claim that keeps losing to another writer's marker update gives up
LAYOUT = 2               # 1: the request was a bare array (no coordinates); not resumable here

# zarr says, on every consolidation, that consolidated metadata is not yet in the v3 spec. The
# sink consolidates from its I/O threads, where ``warnings.catch_warnings`` (process-global
# state) is not safe, so that one notice is silenced for good here.
warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
_REQUEST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ResumePoint(NamedTuple):
    """Where a request may resume: its last committed step, that latent, its weights version."""

    step: int
    latent: np.ndarray
    weights_version: int


class Claim(NamedTuple):
    """A request an attempt owns: its marker as written, that version, the array it writes
    and whether that array is new."""

    record: dict
    version: str
    array: str
    new_array: bool


class Labels(NamedTuple):
    """Names for a request's latent dims (after ``step``) and its coordinates, each
    ``name -> (dim, values)`` with ``dim`` one of ``step`` or the latent dims."""

    dims: tuple[str, ...]
    coords: dict[str, tuple[str, Any]]


def request_key(request: str | int) -> str:
    """A request id as stored: str, letters/digits/``._-`` (ints are accepted and stringified)."""
    key = str(request) if isinstance(request, (int, np.integer)) and not isinstance(request, bool) \
        else request
    if not isinstance(key, str) or not _REQUEST.match(key):
        raise ValueError(f"request id {request!r} must be an int or a string of letters, digits, "
                         "'.', '_', '-' (at most 128, not starting with a symbol)")
    return key


def stage_store_path(stage: str) -> str:
    """``iter-12/rollout`` -> ``iter-000012/rollout.zarr``."""
    return stage_key(stage) + ".zarr"


class LatentStreams:
    """Read and write the latent arrays of a run's stages."""

    def __init__(self, location: RunLocation) -> None:
        self.location = location

    # -- names --------------------------------------------------------------------------------
    def _parts(self, stage: str, request: str, *rest: str) -> tuple[str, ...]:
        return (stage_store_path(stage), "latents", request_key(request), *rest)

    def url(self, stage: str, request: str | int | None = None) -> str:
        if request is None:
            return self.location.child_url(stage_store_path(stage))
        return self.location.child_url(*self._parts(stage, request))

    @staticmethod
    def _commit_parts(stage: str, request: str) -> tuple[str, ...]:
        return (stage_key(stage) + COMMITS, request_key(request) + ".json")

    def _chunk_parts(self, stage: str, request: str, step: int, ndim: int,
                     array: str = LATENT) -> tuple[str, ...]:
        return self._parts(stage, request, array, "c", str(step), *["0"] * ndim)

    def store(self, stage: str, read_only: bool = False) -> Any:
        return self.location.zarr_store(stage_store_path(stage), read_only=read_only)

    # -- reading ------------------------------------------------------------------------------
    def requests(self, stage: str) -> list[str]:
        """Request ids with a latent array in ``stage`` (committed or not)."""
        names = self.location.list_names(stage_store_path(stage), "latents")
        return [n for n in names if _REQUEST.match(n) and n != "zarr.json"]

    def commit_record(self, stage: str, request: str | int) -> dict | None:
        """The commit marker of a request (None if nothing is committed)."""
        parts = self._commit_parts(stage, request)
        try:
            data = self.location.read_bytes(*parts, small=True)
        except FileNotFoundError:
            return None
        return _parse_marker(data, self.location.child_url(*parts))

    def committed_step(self, stage: str, request: str | int) -> int:
        """Last committed step of a request, -1 if none."""
        record = self.commit_record(stage, request)
        return -1 if record is None else int(record["step"])

    def _open_array(self, stage: str, request: str, array: str = LATENT) -> Any:
        import zarr

        path = "/".join(self._parts(stage, request, array)[1:])
        url = self.url(stage, request)

        def open_() -> Any:
            try:
                return zarr.open_array(self.store(stage, read_only=True), path=path, mode="r")
            except (FileNotFoundError, KeyError) as exc:
                self._refuse_old_layout(stage, request)
                raise CorruptObjectError(url, "committed but its Zarr array is missing") from exc

        return self.location.retry(open_, "open", *self._parts(stage, request, array))

    def _refuse_old_layout(self, stage: str, request: str) -> None:
        """A request written as a bare array (layout 1) is an older Spotlight's: say so."""
        try:
            node = json.loads(self.location.read_bytes(*self._parts(stage, request, "zarr.json"),
                                                       small=True))
        except (FileNotFoundError, ValueError):
            return
        if node.get("node_type") == "array":
            raise StorageError(f"{self.url(stage, request)} was written by an older Spotlight "
                               "(latent layout 1, one bare array per request); resume this run "
                               "with that version, or start a new run URL")

    def read_steps(self, stage: str, request: str | int, start: int, stop: int,
                   record: dict | None = None) -> np.ndarray:
        """Committed latents of steps ``start..stop-1``, from the arrays the marker's lineage
        names; an error naming any bad chunk."""
        record = self.commit_record(stage, request) if record is None else record
        last = -1 if record is None else int(record["step"])
        if not 0 <= start < stop <= last + 1:
            raise NotCommittedError(f"steps {start}..{stop - 1} of {self.url(stage, request)} are "
                                    f"not all committed (committed through step {last})")
        return np.concatenate([self._read_array(stage, request, array, lo, hi)
                               for array, lo, hi in segments(lineage_of(record), start, stop)])

    def _read_array(self, stage: str, request: str | int, array: str, start: int,
                    stop: int) -> np.ndarray:
        """Steps ``start..stop-1`` of one of the request's arrays, every chunk checked."""
        arr = self._open_array(stage, request, array)
        ndim = arr.ndim - 1
        # Zarr reads a missing chunk as fill values; a committed step must have its chunk.
        present = self._chunk_keys(stage, request, array) if stop - start > 1 else None
        for step in range(start, stop):
            chunk = self._chunk_parts(stage, request, step, ndim, array)
            found = ("/".join(chunk[-ndim - 2:]) in present) if present is not None \
                else self.location.exists(*chunk)
            if not found:
                raise CorruptObjectError(self.location.child_url(*chunk),
                                         f"chunk of committed step {step} is missing")
        try:  # one call: zarr fetches the chunks concurrently
            return self.location.retry(lambda: arr[start:stop], "read",
                                       *self._parts(stage, request, array))
        except StorageError:
            raise
        except Exception:  # noqa: BLE001 - find and name the chunk that fails
            pass
        for step in range(start, stop):
            chunk = self._chunk_parts(stage, request, step, ndim, array)
            try:
                self.location.retry(lambda s=step: arr[s], "read", *chunk)
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - crc32c mismatch, truncated chunk, ...
                raise CorruptObjectError(self.location.child_url(*chunk),
                                         f"failed its integrity check ({exc})") from exc
        raise CorruptObjectError(self.url(stage, request), "unreadable (no single chunk fails)")

    def _chunk_keys(self, stage: str, request: str | int, array: str = LATENT) -> set[str]:
        """Chunk keys (``c/<t>/0/0``) present in one array, from one recursive listing."""
        base = self.location.path(*self._parts(stage, request, array))
        fs = self.location.fs

        def find() -> list[str]:
            try:
                return fs.find(base + "/c")
            except FileNotFoundError:
                return []

        paths = self.location.retry(find, "list", *self._parts(stage, request, array, "c"))
        prefix = fs._strip_protocol(base).rstrip("/") + "/"
        return {fs._strip_protocol(p)[len(prefix):] for p in paths}

    def written_steps(self, stage: str, request: str | int, array: str = LATENT) -> list[int]:
        """Steps with a chunk in one of the request's arrays, committed or not (an audit of
        what a stale attempt wrote outside the trajectory)."""
        return sorted(int(key.split("/")[1]) for key in self._chunk_keys(stage, request, array))

    def read_trajectory(self, stage: str, request: str | int) -> np.ndarray:
        """All committed latents of a request, shape (committed steps + 1, *latent_shape)."""
        record = self.commit_record(stage, request)
        if record is None or int(record["step"]) < 0:
            raise NotCommittedError(f"nothing committed for {self.url(stage, request)}")
        return self.read_steps(stage, request, 0, int(record["step"]) + 1, record)

    def resume_point(self, stage: str, request: str | int) -> ResumePoint | None:
        """(last committed step, its latent, weights version), or None if nothing is committed
        (an attempt may have claimed the request and died before its first step)."""
        record = self.commit_record(stage, request)
        if record is None or int(record["step"]) < 0:
            return None
        step = int(record["step"])
        latent = self.read_steps(stage, request, step, step + 1, record)[0]
        return ResumePoint(step, latent, int(record["weights_version"]))

    # -- writing (called from the sink's thread) ----------------------------------------------
    def open_for_write(self, stage: str, request: str, *, num_steps: int, shape: tuple,
                       dtype: np.dtype, weights_version: int, fresh: bool = False,
                       labels: Labels | None = None, array: str = LATENT,
                       group: bool = True) -> Any:
        """The request's latent ``array``, created on first use; checked against an existing one.

        ``fresh``: the caller has claimed the array as new (:meth:`claim`) and has run
        :meth:`prepare_stage`. Then the metadata are written as single PUTs, without zarr's
        existence checks and parent-group writes (about twenty S3 round trips per request): the
        request group's and its coordinates too unless ``group`` is False (an attempt taking
        over a request whose group an earlier attempt wrote). ``labels`` name the latent's dims
        and give its coordinates.
        """
        import zarr
        from zarr.errors import ContainsArrayError

        path = "/".join(self._parts(stage, request, array)[1:])
        url = self.url(stage, request)
        store = self.store(stage)
        spec = _array_spec(stage, request, num_steps, tuple(shape), np.dtype(dtype),
                           weights_version, labels)

        def create() -> Any:
            self._ensure_groups(store)
            self._refuse_old_layout(stage, request)
            try:
                return zarr.create_array(store, name=path, **spec)
            except ContainsArrayError:
                return zarr.open_array(store, path=path, mode="r+")

        if fresh:
            return self._create_fresh(stage, request, store, path, spec, labels, group)
        arr = self.location.retry(create, "create", *self._parts(stage, request, array))
        want = (num_steps + 1, *shape)
        if arr.shape != want or arr.dtype != dtype:
            raise StorageError(f"{url} exists with shape {arr.shape} {arr.dtype}, but this stream "
                               f"commits {want} {dtype}; a request must keep its shape and dtype")
        if int(arr.attrs.get("weights_version", weights_version)) != weights_version:
            raise StorageError(f"{url} was started with weights version "
                               f"{arr.attrs['weights_version']}, not {weights_version}; a resumed "
                               "request must use the weights it started with (see resume_point)")
        return arr

    def _create_fresh(self, stage: str, request: str, store: Any, path: str, spec: dict,
                      labels: Labels | None, group_too: bool = True) -> Any:
        """Write a new array's metadata (and its request's coordinates and group's, with
        ``group_too``); return the array."""
        import zarr
        from zarr.core.array import AsyncArray
        from zarr.core.buffer import default_buffer_prototype
        from zarr.storage import StorePath

        group = "/".join(self._parts(stage, request)[1:])
        if group_too and labels is not None:
            self.location.retry(lambda: _write_coords(store, group, labels), "write coordinates of",
                                *self._parts(stage, request))
        if group_too:
            self.location.write_bytes(_group_document(spec["attributes"]),
                                      *self._parts(stage, request, "zarr.json"), durable=False)
        # zarr builds (and validates) the metadata in memory; only its document travels.
        template = zarr.create_array(zarr.storage.MemoryStore(), name=path, **spec)
        metadata = template.metadata
        document = metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
        self.location.write_bytes(document, *self._parts(stage, request, path.rsplit("/", 1)[-1],
                                                         "zarr.json"), durable=False)
        return zarr.Array(AsyncArray(metadata, StorePath(store, path), config=spec["config"]))

    def seal(self, stage: str, request: str | int) -> None:
        """Consolidate a finished request's metadata: xarray then opens it with one read."""
        import zarr

        group = "/".join(self._parts(stage, request)[1:])

        def consolidate() -> None:
            zarr.consolidate_metadata(self.store(stage), path=group)

        self.location.retry(consolidate, "consolidate", *self._parts(stage, request))

    @staticmethod
    def _ensure_groups(store: Any) -> None:
        """Create the stage's root and ``latents`` groups unless present; other writers may be
        creating them at the same moment, which local stores report as ContainsGroupError."""
        import zarr
        from zarr.errors import ContainsGroupError

        for attempt in range(3):
            try:
                zarr.open_group(store, mode="a").require_group("latents")
                return
            except ContainsGroupError:
                if attempt == 2:
                    raise

    def prepare_stage(self, stage: str) -> None:
        """Create a stage's Zarr groups (once, before concurrent request writers)."""
        store = self.store(stage)
        self.location.retry(lambda: self._ensure_groups(store), "create",
                            stage_store_path(stage))

    def write_step(self, arr: Any, stage: str, request: str, step: int, latent: np.ndarray,
                   array: str = LATENT) -> None:
        chunk = self._chunk_parts(stage, request, step, latent.ndim, array)

        def write() -> None:
            arr[step] = latent

        self.location.retry(write, f"write latent step {step} to", *chunk)

    def claim(self, stage: str, request: str, attempt: Attempt, first_step: int,
              base: dict) -> Claim:
        """Make ``attempt`` the owner of ``request`` before it writes a chunk, continuing at
        ``first_step`` (0: it starts the request): a conditional write of the marker naming it.
        StreamOvertakenError if a newer attempt owns the request or another attempt is ahead
        of ``first_step``; nothing is written then."""
        parts = self._commit_parts(stage, request)
        for _ in range(_CLAIM_TRIES):
            try:
                current = read_versioned(self.location, *parts)
                stored = _parse_marker(current.data, self.location.child_url(*parts))
            except FileNotFoundError:
                current, stored = None, None
            newer = fenced_by(stored, attempt)
            last = -1 if stored is None else int(stored["step"])
            if newer is not None or first_step <= last:
                who = f"attempt {newer.key}" if newer is not None else "another attempt"
                raise StreamOvertakenError(
                    f"{who} owns {self.url(stage, request)} (committed through step {last}); "
                    f"attempt {attempt.key} would start at step {first_step}, so it stops")
            if first_step != last + 1:
                raise StorageError(
                    f"the stream starts at step {first_step} but the store has committed through "
                    f"step {last}; resume from resume_point() (step {last}) and commit step "
                    f"{last + 1}")
            record = claimed(stored, attempt, first_step, base)
            array = lineage_of(record)[-1][1]
            if stored is not None and attempt_of(stored) == attempt:   # already its own
                return Claim(record, current.version, array, False)
            data = json.dumps(record, sort_keys=True).encode("utf-8")
            try:
                version = create_exclusive(self.location, data, *parts) if current is None \
                    else replace_if(self.location, data, current.version, *parts)
            except WriteConflict:
                continue   # another attempt moved the marker meanwhile: look again
            return Claim(record, version, array, True)
        raise StreamOvertakenError(f"attempt {attempt.key} could not claim "
                                   f"{self.url(stage, request)}: its marker kept changing")

    def write_commit(self, stage: str, request: str, record: dict, version: str) -> str:
        """Write a request's marker if it still has ``version`` (the owner's last write): the
        new version, or StreamOvertakenError when a newer attempt has claimed it."""
        data = json.dumps(record, sort_keys=True).encode("utf-8")
        parts = self._commit_parts(stage, request)
        try:
            return replace_if(self.location, data, version, *parts)
        except WriteConflict:
            stored = self.commit_record(stage, request)
        mine = attempt_of(record)
        owner = attempt_of(stored)
        if owner == mine:
            raise StorageError(f"the commit marker of {self.url(stage, request)} changed under "
                               f"its owner, attempt {mine.key}; was the store written by hand?")
        step = "?" if stored is None else stored["step"]
        raise StreamOvertakenError(
            f"attempt {owner.key} took {self.url(stage, request)} over (committed through step "
            f"{step}); attempt {mine.key} stops at step {record['step']}, uncommitted")


def _parse_marker(data: bytes, url: str) -> dict:
    try:
        record = json.loads(data.decode("utf-8"))
        int(record["step"]), int(record["weights_version"])
        lineage_of(record)
    except Exception as exc:  # noqa: BLE001 - any failure means a damaged marker
        raise CorruptObjectError(url, f"unreadable commit marker ({exc})") from exc
    return record


def _array_spec(stage: str, request: str, num_steps: int, shape: tuple, dtype: np.dtype,
                weights_version: int, labels: Labels | None = None) -> dict:
    """``zarr.create_array`` arguments of a request's latent array: one chunk per step."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    if labels is not None and len(labels.dims) != len(shape):
        raise ValueError(f"request {request!r}: labels name {len(labels.dims)} dims "
                         f"{labels.dims}, but its latent has {len(shape)} {shape}")
    dims = ("step", *labels.dims) if labels is not None else \
        ("step", "token", "channel") if len(shape) == 2 else \
        ("step", *[f"axis_{i}" for i in range(1, len(shape) + 1)])
    attributes = {"request": request, "stage": stage_key(stage), "num_steps": num_steps,
                  "weights_version": weights_version, "layout": LAYOUT}
    if labels is not None and labels.coords:
        attributes["coordinates"] = " ".join(sorted(labels.coords))   # xarray: these are coords
    return dict(shape=(num_steps + 1, *shape), chunks=(1, *shape), dtype=dtype,
                fill_value=np.nan if dtype.kind == "f" else 0,
                serializer=BytesCodec(), compressors=[Crc32cCodec()],
                chunk_key_encoding={"name": "default", "separator": "/"},
                dimension_names=dims, attributes=attributes,
                config={"write_empty_chunks": True})  # an all-zero step is still written


def _group_document(attributes: dict) -> bytes:
    """A request group's ``zarr.json`` (Zarr v3 group metadata), written in one PUT."""
    attrs = {k: v for k, v in attributes.items() if k != "coordinates"}
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attrs}).encode()


def _write_coords(store: Any, group: str, labels: Labels) -> None:
    """One small array per coordinate, with its dim named (strings as variable-length UTF-8)."""
    import zarr

    for name, (dim, values) in labels.coords.items():
        values = np.asarray(values)
        text = values.dtype.kind in "USO"
        arr = zarr.create_array(store, name=f"{group}/{name}", shape=values.shape,
                                dtype=str if text else values.dtype,
                                dimension_names=(dim,) if values.ndim else (), overwrite=True)
        arr[...] = values.astype(object) if text else values
