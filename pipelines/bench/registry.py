"""The benchmark registry and what every benchmark records (its machine, its JSON result).

Apart from the package so that the bench modules import it without importing the package that
imports them (:func:`pipelines.bench.load_benches`).
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Callable

BENCHES: dict[str, Callable[..., dict]] = {}


def register_bench(name: str):
    def wrap(fn: Callable[..., dict]) -> Callable[..., dict]:
        BENCHES[name] = fn
        return fn
    return wrap


def machine() -> dict:
    """Cores and memory of this machine, recorded beside every figure."""
    memory_gib = None
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"cores": os.cpu_count(), "memory_gib": memory_gib, "platform": platform.platform(),
            "python": platform.python_version()}


def write_result(result: dict, path: str | Path | None) -> str:
    line = json.dumps(result, default=float)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, default=float) + "\n")
    return line
