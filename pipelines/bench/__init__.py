"""Benchmarks: ``spotlight bench NAME [--quick] --json PATH`` runs one and writes one JSON object.

Benchmarks measure; tests assert behaviour. Each records the machine and its wall time.
"""
from __future__ import annotations

from pipelines.bench.registry import BENCHES, machine, register_bench, write_result

__all__ = ["BENCHES", "load_benches", "machine", "register_bench", "write_result"]


def load_benches() -> None:
    """Import the benchmark modules so they register themselves."""
    # On demand: every bench imports torch and Dask, which a CLI call without `bench` never pays.
    from pipelines.bench import (  # noqa: F401
        arms,
        convergence,
        faults,
        learning,
        overhead,
        preemption,
        simulate,
        sp,
        stock,
        storage,
    )
