"""manifest.json: the run's commit record.

Everything the manifest names was written before the manifest recorded it (write-after-data):
a stage is complete if and only if its record is in ``stages``; a checkpoint exists if and only
if its record (with sha256 of every file) is in ``checkpoints``. The manifest is rewritten as one
object (a single PUT on S3, write-and-rename on a local disk), so a reader sees the old or the
new manifest, never a mix. One process -- the driver -- writes it; workers only read it (a
worker writes a checkpoint's files and returns its record; the driver commits the record).

The writer's manifest keeps what it last read or wrote (``cache=True``): as the only writer it
knows the object's content, so checking a stage or recording one costs no read -- on S3 that
was dozens of GETs an iteration. Readers always read afresh.
"""
from __future__ import annotations

import copy
import json
import re
import threading
import time
from typing import Any, Callable

from .errors import CorruptObjectError
from .retry import contains_secret
from .urls import RunLocation

MANIFEST = "manifest.json"
FORMAT = "spotlight-run"
FORMAT_VERSION = 1

_STAGE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ITER_PART = re.compile(r"^iter-(\d+)$")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def iteration_dir(iteration: int) -> str:
    """``iter-000012`` for 12: the directory name of an iteration."""
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative integer, got {iteration!r}")
    return f"iter-{iteration:06d}"


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
        self._known: dict | None = None      # the writer's copy (cache=True)
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
        manifest = self._fetch()
        if self.cache:
            self._known = copy.deepcopy(manifest)
        return manifest

    def _fetch(self) -> dict:
        self.reads += 1
        data = self.location.read_bytes(MANIFEST, small=True)
        try:
            manifest = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptObjectError(self.url, f"not valid JSON ({exc}); restore it from a "
                                     "backup or start a new run URL") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorruptObjectError(self.url, f"not a Spotlight run manifest (format "
                                     f"{manifest.get('format') if isinstance(manifest, dict) else None!r})")
        if manifest.get("format_version", 0) > FORMAT_VERSION:
            raise CorruptObjectError(self.url, f"format_version {manifest['format_version']} is "
                                     f"newer than this code understands ({FORMAT_VERSION}); upgrade")
        return manifest

    def create(self) -> dict:
        """Write an empty manifest unless one exists; return the current one."""
        with self._lock:
            if self.exists():
                return self.read()
            manifest = empty_manifest()
            self._write(manifest)
            return manifest

    def update(self, change: Callable[[dict], Any]) -> dict:
        """Apply ``change`` to a fresh copy of the manifest and write it back as one object."""
        with self._lock:
            manifest = self.read() if self.exists() else empty_manifest()
            new = copy.deepcopy(manifest)
            change(new)
            self._write(new)
            return new

    def _write(self, manifest: dict) -> None:
        try:
            text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"manifest record is not plain JSON ({exc}); pass str/int/float/"
                             "bool/None/list/dict values only") from exc
        leaked = contains_secret(text)
        if leaked:
            raise ValueError(f"refusing to write a credential ({leaked}) into {self.url}; "
                             "pass StorageConfig.public_dict(), not the config itself")
        self._known = None   # a failed write leaves the stored object unknown
        self.location.write_bytes(text.encode("utf-8"), MANIFEST)
        if self.cache:
            self._known = copy.deepcopy(manifest)

    # -- run info -----------------------------------------------------------------------------
    def set_run_info(self, **info: Any) -> dict:
        """Record run-level facts (config, code version, ...) under ``run``."""
        return self.update(lambda m: m.setdefault("run", {}).update(info))

    # -- stage records ------------------------------------------------------------------------
    def mark_stage_done(self, stage: str, info: dict | None = None) -> dict:
        """Record ``stage`` complete. Call only after all of its data is committed."""
        key = stage_key(stage)
        record = {"completed_at": _now(), "info": dict(info or {})}
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
