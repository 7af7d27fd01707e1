"""The benchmark registry and what every benchmark records (its machine, its JSON result).

Apart from the package so that the bench modules import it without importing the package that
imports them (:func:`pipelines.bench.load_benches`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BENCHES: dict[str, Callable[..., dict]] = {}


@dataclass(frozen=True)
class BenchSpec:
    """What ``spotlight bench NAME`` needs before importing the bench (which imports torch and
    Dask): its module, the question it answers (the CLI's help), and the options it takes
    beyond ``--quick`` and ``--json`` (flags of :data:`OPTIONS`). A test checks each against the
    bench function's parameters."""

    module: str
    answers: str
    options: tuple[str, ...] = ()


# Each option of `spotlight bench`: the bench function's parameter it sets.
OPTIONS = {"--task": "task", "--config": "config", "--iterations": "iterations",
           "--seeds": "seeds", "--target": "target", "--budget": "budget",
           "--workers": "workers", "--resume": "resume", "--modes": "modes",
           "--product": "product", "--set": "overrides", "--rounds": "rounds",
           "--devices": "devices", "--trace": "trace", "--run": "runs",
           "--time-scale": "time_scale", "--scenarios": "scenarios"}

SPECS = {
    "learning": BenchSpec(
        "pipelines.bench.learning", "does RL raise the validation reward (single process)",
        ("--task", "--config", "--iterations")),
    "convergence": BenchSpec(
        "pipelines.bench.convergence", "how many iterations each mode needs to reach a target, "
        "over paired seeds", ("--task", "--config", "--iterations", "--seeds", "--target",
                              "--budget", "--workers", "--resume", "--modes", "--product",
                              "--set")),
    "arms": BenchSpec(
        "pipelines.bench.arms", "what each exploration arm delivers, and whether stale weights "
        "keep the seeds' ranking", ("--task", "--config", "--iterations", "--set")),
    "overhead": BenchSpec(
        "pipelines.bench.overhead", "what Dask and latent streaming cost against the same work "
        "in one process", ("--task", "--config", "--iterations", "--rounds", "--set")),
    "preemption": BenchSpec(
        "pipelines.bench.preemption", "what a spot trace's kills cost a run, and whether its "
        "results stay identical", ("--config", "--iterations", "--trace", "--time-scale",
                                   "--scenarios", "--set")),
    "faults": BenchSpec(
        "pipelines.bench.faults", "partitions, a zombie, two drivers, a store outage, lost "
        "driver and scheduler hosts, a CPU-starved worker, across network-namespace hosts",
        ("--config", "--iterations", "--scenarios", "--set")),
    "sp": BenchSpec(
        "pipelines.bench.sp", "elastic sequence parallelism: exactness, regroup against cold "
        "start, requests under kills", ("--devices", "--rounds")),
    "sharded": BenchSpec(
        "pipelines.bench.sharded", "sharded training (FSDP2) over the gpu workers: exact step, "
        "memory per worker, resume on another worker count", ("--workers",)),
    "scale": BenchSpec(
        "pipelines.bench.scale", "what the control plane (scheduler, dispatch, lease, store "
        "markers) costs as workers grow to hundreds", ("--workers", "--iterations")),
    "simulate": BenchSpec(
        "pipelines.bench.simulate", "paper-scale time and cost to target over a spot trace, "
        "validated against a measured run", ("--config", "--trace", "--run", "--set")),
    "storage": BenchSpec(
        "pipelines.bench.storage", "what streaming every denoising step to the store costs "
        "(file and S3)", ("--config",)),
    "stock-workers": BenchSpec(
        "pipelines.bench.stock", "the embedded cluster against stock dask scheduler and "
        "workers", ("--config", "--iterations", "--rounds")),
}


def benches_taking(flag: str) -> list[str]:
    """The benches whose options include ``flag``, in :data:`SPECS`' order."""
    return [name for name, spec in SPECS.items() if flag in spec.options]


def load_bench(name: str) -> Callable[..., dict]:
    """The bench ``name`` (:data:`SPECS`), its module imported now."""
    import importlib

    importlib.import_module(SPECS[name].module)
    return BENCHES[name]


def register_bench(name: str):
    def wrap(fn: Callable[..., dict]) -> Callable[..., dict]:
        BENCHES[name] = fn
        return fn
    return wrap


def worker_counts(text: str) -> list[int]:
    """``--workers``: one count, or several joined by commas (``bench scale``)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: expected a count or counts "
                                         "joined by commas, each at least 1 (e.g. 8,64,256)")
    return counts


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
