"""Weights named by a Hugging Face Hub id: ``Qwen/Qwen-Image`` or
``stabilityai/stable-diffusion-3.5-medium``, with ``@<revision>`` (a branch, tag or commit;
``main`` if none), fetched through huggingface_hub into its standard cache as
``from_pretrained`` would. huggingface_hub's own settings apply as it reads them: ``HF_TOKEN``
(or ``hf auth login``), ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT``
(a mirror).

The components' JSON files come first and are checked, so a repo that is not one of the model's
is refused before any weight moves; then the component folders (and ``model_index.json``) are
fetched at the commit those configs came from, and every file is checked against the checksum
the Hub named its blob by (sha256 for LFS files, git's sha1 for the others) and recorded with its
size under the Spotlight cache (``hub/``). That happens once per machine: a later start finds the
record, checks each file's size and makes no request -- so a branch or tag stays at the commit it
first resolved to on that machine (pin a commit to give every machine the same weights).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from spotlight.staging import FolderCheck, StagingError, cache_root

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>\S+))?")
BLOB_CHECKSUM = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")   # git sha1 / LFS sha256, as blob names
MODEL_INDEX = "model_index.json"


class HubError(StagingError):
    """A Hub id that cannot give its weights: unknown, gated, offline and not cached, damaged."""


def parse_hub_id(weights: str) -> tuple[str, str] | None:
    """``(repo, revision)`` when ``weights`` names a Hub model repo, else None; an existing
    folder of that name wins (``org/name`` is also a relative path)."""
    match = HUB_ID.fullmatch(weights)
    if match is None or Path(weights).expanduser().is_dir():
        return None
    repo = match["repo"]
    if "--" in repo or ".." in repo or repo.endswith(".git"):   # not a repo id on the Hub
        return None
    return repo, match["revision"] or "main"


def hub_folder(repo: str, revision: str, named: str, components: list[str], check: FolderCheck,
               configs_only: bool = False) -> Path:
    """The snapshot of ``repo`` at ``revision`` in the Hub cache, holding ``components``
    (folders) and ``model_index.json`` and passing ``check``; with ``configs_only`` only their
    JSON files are fetched (what a check before the run reads)."""
    from filelock import FileLock

    record = _record_path(repo, revision)
    record.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{record}.lock"):      # one fetch per machine: other workers wait for it
        folder = _recorded(record, named) if record.is_file() else None
        if folder is not None:
            return folder
        folder = _snapshot(repo, revision, named,
                           [MODEL_INDEX] + [f"{c}/*.json" for c in components])
        check(folder, named)
        if configs_only:
            return folder
        patterns = [MODEL_INDEX] + [f"{c}/*" for c in components]
        # the commit the configs came from, not the branch again: it may have moved since
        folder = _snapshot(repo, folder.name, named, patterns)
        _record(record, repo, revision, folder, patterns)
    return folder


def _record_path(repo: str, revision: str) -> Path:
    """Where this machine records the snapshot of ``repo@revision`` in this Hub cache."""
    from huggingface_hub import constants

    hub_cache = os.path.realpath(os.path.expanduser(constants.HF_HUB_CACHE))
    key = hashlib.sha256(f"{hub_cache}\n{repo}\n{revision}".encode()).hexdigest()[:16]
    return cache_root() / "hub" / f"{repo.replace('/', '--')}-{key}.json"


def _snapshot(repo: str, revision: str, named: str, patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except (HfHubHTTPError, LocalEntryNotFoundError) as err:
        raise _explain(err, repo, revision, named) from None


def _explain(err: Exception, repo: str, revision: str, named: str) -> HubError:
    """What went wrong with ``repo@revision`` and what to do, in huggingface_hub's terms."""
    from huggingface_hub import constants, errors, get_token

    hub = constants.ENDPOINT
    where = f"model.weights {named!r} (Hub repo {repo!r} at revision {revision!r} on {hub})"
    fetch = f"`hf download {repo} --revision {revision}`"
    if isinstance(err, errors.GatedRepoError):
        token = ("no token is set" if get_token() is None else
                 "the token set (HF_TOKEN or `hf auth login`) has no access to it")
        return HubError(f"{where}: the repo is gated and {token}; accept its conditions at "
                        f"{hub}/{repo} with your account, then set HF_TOKEN to a token of that "
                        "account (or run `hf auth login`) on every machine")
    if isinstance(err, errors.RepositoryNotFoundError):
        return HubError(f"{where}: no such repo (a private one reads the same without a token: "
                        f"set HF_TOKEN or run `hf auth login`), and no folder {named!r} in "
                        f"{os.getcwd()}")
    if isinstance(err, errors.RevisionNotFoundError):
        return HubError(f"{where}: the repo has no revision {revision!r}; name one of its "
                        f"branches, tags or commits after '@' ({repo}@<revision>)")
    cache = constants.HF_HUB_CACHE
    if isinstance(err, errors.LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE:
        return HubError(f"{where}: HF_HUB_OFFLINE is set and the Hugging Face cache {cache} "
                        f"holds no complete snapshot of it; fetch it on this machine first with "
                        f"{fetch} (same HF_HOME / HF_HUB_CACHE), or unset HF_HUB_OFFLINE")
    if isinstance(err, errors.LocalEntryNotFoundError):
        cause = _first_line(err.__cause__ or err)
        return HubError(f"{where}: the Hub could not be reached ({cause}) and the Hugging Face "
                        f"cache {cache} holds no complete snapshot of it; check the network and "
                        f"HF_ENDPOINT, or fetch it ahead with {fetch}")
    return HubError(f"{where}: {_first_line(err)}")


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0].strip()}" if lines else type(err).__name__


def _recorded(record: Path, named: str) -> Path | None:
    """The recorded snapshot, every file at its recorded size; None if the Hub cache lost it."""
    entry = json.loads(record.read_text())
    folder = Path(entry["folder"])
    if not folder.is_dir():
        return None                       # the cache was cleared (hf cache rm): fetch again
    for name, file in entry["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != file["size"]:
            raise HubError(f"model.weights {named!r}: the cached snapshot {folder} is damaged "
                           f"({name}); fetch it again with `hf download {entry['repo']} "
                           f"--revision {entry['commit']} --force-download`")
    return folder


def _record(record: Path, repo: str, revision: str, folder: Path, patterns: list[str]) -> None:
    """Check every fetched file against its blob's checksum, then record sha256 and size."""
    from huggingface_hub import constants
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files, damaged = {}, []
    for name in filter_repo_objects(names, allow_patterns=patterns):
        sha256, matches = _checksum(folder / name)
        files[name] = {"sha256": sha256, "size": (folder / name).stat().st_size}
        if not matches:
            damaged.append(name)
    if damaged:
        raise HubError(f"Hub repo {repo!r} at {folder.name}: {damaged} do not match the "
                       f"checksums the Hub gave them; fetch them again with `hf download {repo} "
                       f"--revision {folder.name} --force-download`")
    text = json.dumps({"repo": repo, "revision": revision, "commit": folder.name,
                       "endpoint": constants.ENDPOINT, "folder": str(folder), "files": files},
                      indent=1)
    fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=record.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, record)


def _checksum(path: Path) -> tuple[str, bool]:
    """The sha256 of a snapshot file, and whether it matches the checksum its blob is named by
    (the Hub cache names blobs by ETag: LFS sha256, or git's blob sha1); True where the cache
    copies files instead of linking blobs, and so keeps no name to check against."""
    blob = path.resolve().name if path.is_symlink() else ""
    expected = blob if BLOB_CHECKSUM.fullmatch(blob) else None
    sha256 = hashlib.sha256()
    git_sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size) if expected and \
        len(expected) == 40 else None
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha256.update(block)
            if git_sha1 is not None:
                git_sha1.update(block)
    actual = (git_sha1 or sha256).hexdigest()
    return sha256.hexdigest(), expected is None or actual == expected
