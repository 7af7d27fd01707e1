"""Conditional writes: create an object only if it is absent, replace it only if unchanged.

Two writers of one object -- two drivers on one run, two attempts of one request -- must not
lose each other's updates silently. Every compare-and-swap here reads an object with its
*version* and writes back only if the version still holds; the loser gets ``WriteConflict``
and decides (re-read and retry, or stop because it was fenced).

- S3: the version is the ETag; ``If-None-Match: *`` creates, ``If-Match: <etag>`` replaces
  (the server checks, so writers on different hosts are ordered by the store itself).
- Local disk: the version is the content's sha256; creation links a finished temporary file
  into place (``link`` fails if the name exists), replacement holds an advisory lock on a
  sidecar file while it compares and renames (released by the kernel if the writer dies).
- Memory (tests): a process lock around compare and write.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import uuid
from dataclasses import dataclass

from .errors import WriteConflict
from .urls import RunLocation

_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict")
_MEMORY_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Versioned:
    """An object's bytes and the version a conditional replace must name."""

    data: bytes
    version: str


def content_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_versioned(loc: RunLocation, *parts: str) -> Versioned:
    """The object and its version, read in one request; FileNotFoundError if absent."""
    if loc.scheme == "s3":
        return loc.retry(lambda: _s3_get(loc, *parts), "read", *parts)
    data = loc.read_bytes(*parts, small=True)
    return Versioned(data, content_version(data))


def create_exclusive(loc: RunLocation, data: bytes, *parts: str) -> str:
    """Write ``data`` only if no object is there yet; its version, or WriteConflict."""
    path = loc.path(*parts)
    if loc.scheme == "file":
        loc.retry(lambda: _link_new_file(loc, path, data, *parts), "create", *parts)
        return content_version(data)
    if loc.scheme == "s3":
        return _s3_put(loc, data, parts, mode="create")
    with _MEMORY_LOCK:
        if loc.fs.exists(path):
            raise WriteConflict(loc.child_url(*parts), "it already exists")
        loc.fs.pipe_file(path, data)
    return content_version(data)


def replace_if(loc: RunLocation, data: bytes, version: str, *parts: str) -> str:
    """Write ``data`` only if the object still has ``version``; the new version, or
    WriteConflict (changed since it was read, or gone)."""
    path = loc.path(*parts)
    if loc.scheme == "s3":
        return _s3_put(loc, data, parts, if_match=version)
    lock = _file_lock(path) if loc.scheme == "file" else _locked(_MEMORY_LOCK)
    with lock:
        try:
            current = content_version(loc.fs.cat_file(path))
        except FileNotFoundError:
            raise WriteConflict(loc.child_url(*parts), "it no longer exists") from None
        if current != version:
            raise WriteConflict(loc.child_url(*parts), "another writer changed it since it "
                                "was read")
        loc.write_bytes(data, *parts)
    return content_version(data)


# -- local disk -----------------------------------------------------------------------------
def _link_new_file(loc: RunLocation, path: str, data: bytes, *parts: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)   # atomic, and fails if the name exists: readers never see half
        except FileExistsError:
            raise WriteConflict(loc.child_url(*parts), "it already exists") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def _file_lock(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock_path = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


@contextlib.contextmanager
def _locked(lock: threading.Lock):
    with lock:
        yield


# -- S3 -------------------------------------------------------------------------------------
def _s3_get(loc: RunLocation, *parts: str) -> Versioned:
    from fsspec.asyn import sync

    bucket, key, _ = loc.fs.split_path(loc.path(*parts))

    async def get() -> Versioned:
        response = await loc.fs._call_s3("get_object", Bucket=bucket, Key=key)
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return Versioned(data, response["ETag"])

    try:
        return sync(loc.fs.loop, get)
    except FileNotFoundError:
        raise FileNotFoundError(f"{loc.child_url(*parts)} does not exist") from None


def _s3_put(loc: RunLocation, data: bytes, parts: tuple, *, mode: str = "overwrite",
            if_match: str | None = None) -> str:
    path = loc.path(*parts)
    condition = {"IfMatch": if_match} if if_match is not None else {}
    tries = {"n": 0}

    def put() -> str:
        tries["n"] += 1
        return loc.fs.pipe_file(path, data, mode=mode, **condition)["ETag"]

    try:
        return loc.retry(put, "conditional write", *parts)
    except FileNotFoundError:
        raise WriteConflict(loc.child_url(*parts), "it no longer exists") from None
    except OSError as exc:
        if not _is_conflict(exc):
            raise
        # A retried PUT may have landed the first time. Callers make every write unique (a
        # revision and the writer's id), so equal bytes are this writer's, not a rival's.
        if tries["n"] > 1:
            landed = read_versioned(loc, *parts)
            if landed.data == data:
                return landed.version
        why = "it already exists" if mode == "create" else "another writer changed it"
        raise WriteConflict(loc.child_url(*parts), why) from exc


def _is_conflict(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 5:
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in _CONFLICT_CODES:
            return True
        if isinstance(exc, FileExistsError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False

