"""Model folders a user stages: a local folder, or an object-storage URL copied once into the
local cache through fsspec and checksummed.

The copy is made in a temporary folder and moved into place when complete, so a killed copy never
counts; at later starts every file is checked against its recorded size (hashing tens of GB at
every worker start would cost minutes; the sha256 of each file is recorded for audits).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from spotlight.cache import cache_dir

CHECKSUMS = ".spotlight-sha256.json"   # sha256 and size of every file of a cached copy
FolderCheck = Callable[[Path, str], None]   # (folder, as the user named it) -> None or an error


class StagingError(ValueError):
    """A staged folder or URL that is missing, incomplete or damaged."""


def staged_folder(source: str, what: str, check: FolderCheck | None = None) -> Path:
    """A local folder holding ``source`` (a path, ``file://`` path or object-storage URL);
    ``check`` raises a clear error for a folder that lacks what ``what`` needs."""
    if "://" in source and not source.startswith("file://"):
        return _cached_copy(source, what, check)
    folder = Path(source.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise StagingError(f"{what} {source!r}: no such folder")
    if check is not None:
        check(folder, source)
    return folder


def cache_root() -> Path:

    return Path(cache_dir())


def publish(built: Path, folder: Path, marker: str) -> None:
    """Move a finished folder into place; another process may have published it first."""
    try:
        os.replace(built, folder)
    except OSError:
        if not (folder / marker).is_file():
            raise
        shutil.rmtree(built, ignore_errors=True)


def _cached_copy(url: str, what: str, check: FolderCheck | None) -> Path:
    import fsspec

    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    folder = cache_root() / "weights" / key
    if (folder / CHECKSUMS).is_file():
        _verify(folder, url)
        return folder
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.isdir(path):
        raise StagingError(f"{what} {url!r}: no such folder in object storage")
    folder.parent.mkdir(parents=True, exist_ok=True)
    copying = Path(tempfile.mkdtemp(prefix=key + ".", dir=folder.parent))
    try:
        fs.get(path.rstrip("/") + "/", str(copying), recursive=True)
        if check is not None:
            check(copying, url)
        sums = {str(p.relative_to(copying)): {"sha256": file_sha256(p), "size": p.stat().st_size}
                for p in sorted(copying.rglob("*")) if p.is_file()}
        (copying / CHECKSUMS).write_text(json.dumps({"url": url, "files": sums}, indent=1))
    except BaseException:
        shutil.rmtree(copying, ignore_errors=True)   # a failed copy leaves nothing behind
        raise
    publish(copying, folder, CHECKSUMS)
    return folder


def _verify(folder: Path, url: str) -> None:
    """Every file of a cached copy is still there at its recorded size."""
    record = json.loads((folder / CHECKSUMS).read_text())
    for name, entry in record["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != entry["size"]:
            raise StagingError(f"the cached copy of {url!r} at {folder} is damaged ({name}); "
                               "delete that folder and run again to copy it afresh")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
