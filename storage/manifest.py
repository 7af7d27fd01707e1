"""manifest.json: the run's commit record.

Everything the manifest names was written before the manifest recorded it (write-after-data):
a stage is complete if and only if its record is in ``stages``; a checkpoint exists if and only
if its record (with sha256 of every file) is in ``checkpoints``. The manifest is rewritten as one
object (a single PUT on S3, write-and-rename on a local disk), so a reader sees the old or the
new manifest, never a mix. One process -- the driver -- writes it; workers only read it (a
worker writes a checkpoint's files and returns its record; the driver commits the record).

Every update is a compare-and-swap (``storage.conditional``): it names the version it read, and
a writer that lost the race re-reads and applies its change again, so no update is lost even
if two processes write. A driver holding the run's lease sets ``epoch`` and ``guard``: every
update first checks that the lease is still its own, its writes stamp ``writer_epoch``, and
once a manifest carries a newer epoch every update of an older driver is refused with
DriverFenced.

The writer's manifest keeps what it last read or wrote (``cache=True``): checking a stage or
recording one costs no read -- on S3 that was dozens of GETs an iteration; a stale copy is
found out by the compare-and-swap. Readers always read afresh.
"""
from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from typing import Any, Callable

from .conditional import WriteConflict, create_exclusive, read_versioned, replace_if
from .errors import CorruptObjectError, DriverFenced, StorageError
from .retry import contains_secret
from .urls import RunLocation

MANIFEST = "manifest.json"
FORMAT = "spotlight-run"
FORMAT_VERSION = 1

_STAGE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ITER_PART = re.compile(r"^iter-(\d+)$")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_CAS_TRIES = 20   # writers racing on one manifest: each loser re-reads and tries again


def iteration_dir(iteration: int) -> str:
    """``iter-000012`` for 12: the directory name of an iteration."""
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative integer, got {iteration!r}")
    return f"iter-{iteration:06d}"


def stage_name(iteration: int | None, stage: str) -> str:
    """``iter-<k>/<stage>``, or ``stage`` alone for run-level stages (``base-validation``): a
    stage's name in the run store (:func:`stage_key` is its canonical, sortable form)."""
    return stage if iteration is None else f"iter-{iteration}/{stage}"


def stage_key(stage: str) -> str:
    """Canonical stage name: ``iter-12/rollout`` -> ``iter-000012/rollout``.

    A stage is one or more ``/``-separated parts of letters, digits, ``.``, ``_`` and ``-``;
    an ``iter-N`` part is zero-padded to six digits so names sort by iteration.
    """
    if not isinstance(stage, str) or not stage:
        raise ValueError(f"stage must be a non-empty string like 'iter-12/rollout', got {stage!r}")
    parts = stage.strip("/").split("/")
    out = []
    for part in parts:
        if not _STAGE_PART.match(part):
            raise ValueError(f"stage {stage!r}: part {part!r} may hold only letters, digits, "
                             "'.', '_' and '-' (e.g. 'iter-12/rollout')")
        m = _ITER_PART.match(part)
        if part.startswith("iter-") and not m:
            raise ValueError(f"stage {stage!r}: part {part!r} starts like an iteration but is "
                             "not 'iter-<non-negative integer>'")
        out.append(iteration_dir(int(m.group(1))) if m else part)
    return "/".join(out)


def stage_iteration(stage: str) -> int | None:
    """The iteration a stage belongs to (``iter-12/rollout`` -> 12), or None."""
    m = _ITER_PART.match(stage_key(stage).split("/", 1)[0])
    return int(m.group(1)) if m else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def empty_manifest() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created_at": _now(),
            "run": {}, "stages": {}, "checkpoints": {}}


class Manifest:
    """Read-modify-write access to ``RUN_URL/manifest.json``."""

    def __init__(self, location: RunLocation, *, cache: bool = False) -> None:
        self.location = location
        self.url = location.child_url(MANIFEST)
        self.cache = cache
        self.reads = 0                       # objects fetched from storage (for benchmarks)
        self.epoch: int | None = None        # the lease epoch of this writer (None: no lease)
        self.guard: Callable[[], None] | None = None   # raises if this writer lost its lease
        self._known: dict | None = None      # the writer's copy (cache=True)
        self._version: str | None = None     # the stored version _known was read or written as
        self._writer = uuid.uuid4().hex      # makes each write's bytes this writer's own
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(self.url, threading.Lock())

    # -- raw access ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.cache and self._known is not None) or self.location.exists(MANIFEST)

    def read(self) -> dict:
        """The current manifest; an error if it is unreadable. A reader reads afresh every
        call; the writer (``cache=True``) reads once and then knows it."""
        if self.cache and self._known is not None:
            return copy.deepcopy(self._known)
        manifest, version = self._fetch_versioned()
        if self.cache:
            self._known, self._version = copy.deepcopy(manifest), version
        return manifest

    def _fetch_versioned(self) -> tuple[dict, str]:
        self.reads += 1
        seen = read_versioned(self.location, MANIFEST)
        return self._parse(seen.data), seen.version

    def _parse(self, data: bytes) -> dict:
        try:
            manifest = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptObjectError(self.url, f"not valid JSON ({exc}); restore it from a "
                                     "backup or start a new run URL") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise CorruptObjectError(self.url, f"not a Spotlight run manifest (format {found!r})")
        if manifest.get("format_version", 0) > FORMAT_VERSION:
            raise CorruptObjectError(self.url, f"format_version {manifest['format_version']} is "
                                     f"newer than this code understands ({FORMAT_VERSION}); "
                                     "upgrade")
        return manifest

    def create(self) -> dict:
        """Write an empty manifest unless one exists; return the current one."""
        with self._lock:
            if self.exists():
                return self.read()
            try:
                return self._swap(None, empty_manifest())
            except WriteConflict:   # another process created it first: theirs stands
                return self.read()

    def update(self, change: Callable[[dict], Any]) -> dict:
        """Apply ``change`` to the current manifest and write it back as one object, only if
        no other writer changed it in between (else re-read and apply ``change`` again)."""
        with self._lock:
            for _ in range(_CAS_TRIES):
                if self.guard is not None:
                    self.guard()
                manifest, version = self._for_update()
                self._refuse_if_fenced(manifest)
                new = copy.deepcopy(manifest)
                change(new)
                try:
                    return self._swap(version, new)
                except WriteConflict:
                    self._known = self._version = None   # someone else wrote: read afresh
            raise StorageError(f"{self.url}: {_CAS_TRIES} writers kept changing the manifest "
                               "while this one updated it; only one driver may run a store")

    def _for_update(self) -> tuple[dict, str | None]:
        if self.cache and self._known is not None and self._version is not None:
            return copy.deepcopy(self._known), self._version
        try:
            manifest, version = self._fetch_versioned()
        except FileNotFoundError:
            return empty_manifest(), None
        if self.cache:
            self._known, self._version = copy.deepcopy(manifest), version
        return manifest, version

    def _refuse_if_fenced(self, manifest: dict) -> None:
        newest = manifest.get("writer_epoch", 0)
        if self.epoch is not None and newest > self.epoch:
            raise DriverFenced(f"{self.url}: the manifest was last written by the driver of "
                               f"epoch {newest}, after this driver's epoch {self.epoch}: another "
                               "driver took the run over; this driver's writes are refused")

    def _swap(self, version: str | None, manifest: dict) -> dict:
        """Write ``manifest`` over ``version`` (None: create); WriteConflict if it moved."""
        if self.epoch is not None:
            manifest["writer_epoch"] = max(self.epoch, manifest.get("writer_epoch", 0))
        manifest["revision"] = manifest.get("revision", 0) + 1
        manifest["written_by"] = self._writer
        data = self._encode(manifest)
        self._known = self._version = None   # a failed write leaves the stored object unknown
        if version is None:
            new_version = create_exclusive(self.location, data, MANIFEST)
        else:
            new_version = replace_if(self.location, data, version, MANIFEST)
        if self.cache:
            self._known, self._version = copy.deepcopy(manifest), new_version
        return manifest

    def _encode(self, manifest: dict) -> bytes:
        try:
            text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"manifest record is not plain JSON ({exc}); pass str/int/float/"
                             "bool/None/list/dict values only") from exc
        leaked = contains_secret(text)
        if leaked:
            raise ValueError(f"refusing to write a credential ({leaked}) into {self.url}; "
                             "pass StorageConfig.public_dict(), not the config itself")
        return text.encode("utf-8")

    # -- run info -----------------------------------------------------------------------------
    def set_run_info(self, **info: Any) -> dict:
        """Record run-level facts (config, code version, ...) under ``run``."""
        return self.update(lambda m: m.setdefault("run", {}).update(info))

    # -- stage records ------------------------------------------------------------------------
    def mark_stage_done(self, stage: str, info: dict | None = None) -> dict:
        """Record ``stage`` complete. Call only after all of its data is committed."""
        key = stage_key(stage)
        record = {"completed_at": _now(), "at": time.time(), "info": dict(info or {})}
        if self.epoch is not None:   # which driver recorded it: an audit of fencing reads it
            record["epoch"] = self.epoch
        self.update(lambda m: m.setdefault("stages", {}).__setitem__(key, record))
        return record

    def is_stage_done(self, stage: str) -> bool:
        return self.stage_record(stage) is not None

    def stage_record(self, stage: str) -> dict | None:
        if not self.exists():
            return None
        return copy.deepcopy(self._current().get("stages", {}).get(stage_key(stage)))

    def stages(self) -> dict[str, dict]:
        """All stage records, by canonical stage name."""
        return copy.deepcopy(self._current().get("stages", {})) if self.exists() else {}

    def _current(self) -> dict:
        """The manifest for a read-only look (the writer's own copy, not a deep copy of it)."""
        if self.cache and self._known is not None:
            return self._known
        return self.read()
