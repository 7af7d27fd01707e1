"""Benchmarks: ``spotlight bench NAME [--quick] --json PATH`` runs one and writes one JSON object.

Benchmarks measure; tests assert behaviour. Each records the machine and its wall time.
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


def load_benches() -> None:
    """Import the benchmark modules so they register themselves."""
    from pipelines.bench import (convergence, learning, overhead, preemption,  # noqa: F401
                                 simulate, sp, stock, storage)
