"""Benchmarks: ``spotlight bench NAME [--quick] --json PATH`` runs one and writes one JSON object.

Benchmarks measure; tests assert behaviour. Each records the machine and its wall time.
"""
from __future__ import annotations

from pipelines.bench.registry import (
    BENCHES,
    SPECS,
    load_bench,
    machine,
    register_bench,
    write_result,
)

__all__ = ["BENCHES", "SPECS", "load_bench", "load_benches", "machine", "register_bench",
           "write_result"]


def load_benches() -> None:
    """Import every benchmark module (each registers itself). On demand: every bench imports
    torch and Dask, which a CLI call without `bench` never pays."""
    for name in SPECS:
        load_bench(name)
