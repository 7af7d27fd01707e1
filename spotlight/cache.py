"""Where trained artefacts (base models, recognisers) are cached, keyed by config hash."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPOTLIGHT_CACHE`` if set, else ``~/.cache/spotlight`` (``$XDG_CACHE_HOME`` honoured)."""
    root = os.environ.get("SPOTLIGHT_CACHE")
    if root:
        path = Path(root)
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spotlight"
    path.mkdir(parents=True, exist_ok=True)
    return path
