"""Where trained artefacts (base models, recognisers) are cached, keyed by config hash."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    """``$SPOTLIGHT_CACHE`` if set, else ``~/.cache/spotlight`` (``$XDG_CACHE_HOME`` honoured)."""
    root = os.environ.get("SPOTLIGHT_CACHE")
    if root:
        path = Path(root)
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spotlight"
    path.mkdir(parents=True, exist_ok=True)
    return path


# A folder read before the cache for trained models (the digits base, the recogniser): a
# bench's own copies, shipped with its saved parts so that it resumes on another machine from
# the very weights it started from (pipelines.bench.shipped).
MODELS_ENV = "SPOTLIGHT_MODELS"


def model_dir(name: str) -> Path:
    """Where the trained model ``name`` lives: in ``$SPOTLIGHT_MODELS`` when that is set, else
    in :func:`cache_dir`."""
    root = os.environ.get(MODELS_ENV)
    return (Path(root) if root else cache_dir()) / name


def write_atomically(target: Path, write: Callable[[str], object]) -> None:
    """``write(tmp)`` into a temporary file beside ``target``, then rename it over ``target``: a
    concurrent reader never sees half a file, and processes that make the same cache entry at
    once (two test or bench processes, say) never write into each other's file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
