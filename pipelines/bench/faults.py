"""``spotlight bench faults``: the failures of a run spread over machines, on the test bed.

Every host is a network namespace (:mod:`pipelines.bench.testbed`): a TLS ``dask scheduler``,
stock ``dask worker`` processes for gpu and spot, an S3 server and the driver, each on its own.
One clean run is the reference; then each scenario runs the same config under one fault:

- ``partition``: a spot host's link goes down while it explores, and comes back later;
- ``zombie``: two attempts of one request on two hosts write *different* values (as GPUs with
  non-deterministic kernels would); the older one is cut off, then healed after the newer one
  finished;
- ``dual_driver``: a second ``spotlight run --resume`` while the first runs, then a forced
  takeover;
- ``store_outage``: the S3 host's link is down for ``outage_s`` mid-run;
- ``driver_loss``: the driver is SIGKILLed; another host's driver takes the expired lease over;
- ``cpu_hog``: a spot worker shares one core with busy processes (slow, not silent);
- ``scheduler_loss``: the scheduler is killed; the run resumes against a new scheduler.

Per scenario: ``requests_lost``, ``identical_to_clean``, ``foreign_writes`` (writes of a fenced
attempt or driver found in the run's state afterwards), ``detect_s`` and ``recover_s`` (each
defined in its scenario's docstring; ``false_cut_offs`` for the CPU hog). The JSON is saved
after every scenario.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import yaml

from pipelines.bench.bed_cluster import start_bed_cluster
from pipelines.bench.fault_scenarios import SCENARIOS, Bench, clean_run
from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.bench.testbed import Testbed, unavailable
from spotlight.config import load_config, shipped_config

# Settings every run of the bench uses: exploration fixed (runs compare bit for bit), spot
# exploring on two hosts. Liveness is the default's: a partition is found by its heartbeats.
BENCH_SETTINGS = {"planner.enabled": False, "exploration.deadline": False,
                  "cluster.dashboard": False, "validation.every": 1000}
QUICK = {"grpo.prompts_per_iteration": 4, "grpo.group_size": 4, "grpo.micro_batch": 16,
         "validation.max_prompts": 8, "exploration.candidates": 8,
         "exploration.request_batch": 4}


def write_bench_config(root: Path, config: str | None, quick: bool,
                       overrides: dict | None) -> Path:
    """The run config every run of the bench uses, as a file the drivers on the bed read."""
    settings = {**BENCH_SETTINGS, **(QUICK if quick else {}), **(overrides or {})}
    cfg = load_config(config or shipped_config("digits.yaml"), settings)
    path = root / "faults-run.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


@register_bench("faults")
def bench_faults(quick: bool = False, config: str | None = None, iterations: int | None = None,
                 json_path: str | None = None, overrides: dict | None = None,
                 scenarios: list[str] | None = None, **_: object) -> dict:
    chosen = tuple(scenarios or SCENARIOS)
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"bench faults: unknown scenarios {unknown}; choose from "
                         f"{list(SCENARIOS)}")
    problem = unavailable()
    if problem:
        raise RuntimeError(f"bench faults runs on a network-namespace test bed, which this "
                           f"machine cannot make: {problem}. Run it as root on Linux with `ip`")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-faults-"))
    iterations = iterations or (2 if quick else 3)
    result = {"bench": "faults", "complete": False, "iterations": iterations,
              "settings": {**BENCH_SETTINGS, **(QUICK if quick else {}), **(overrides or {})},
              "runs": str(root),
              "machine": machine(), "tls": True}
    with Testbed() as bed:
        cluster = start_bed_cluster(bed, root / "bed", gpu=1, spot=2,
                                    spare=("driver-2", "scheduler-2"))
        bench = Bench(bed, cluster, write_bench_config(root, config, quick, overrides),
                      iterations, root)
        result["config"] = str(bench.config_path)
        if set(chosen) - {"zombie"}:   # the zombie scenario has its own reference
            result["clean"] = clean_run(bench)
        for name in chosen:
            result["hosts"] = sorted(bed.hosts)
            result["wall_s"] = time.monotonic() - started
            if json_path:
                write_result(result, json_path)   # what is done so far survives a cut-off bench
            try:
                found = SCENARIOS[name](bench)
            except Exception as exc:   # noqa: BLE001 - recorded; the other scenarios still run
                found = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
            result.setdefault("scenarios", {})[name] = found
        result["hosts"] = sorted(bed.hosts)
    result.update(complete=True, wall_s=time.monotonic() - started,
                  targets=targets_met(result.get("scenarios", {})))
    shutil.rmtree(root / "bed" / "pki", ignore_errors=True)   # keys are not kept
    return result


def targets_met(found: dict) -> dict:
    """The issue's targets, per scenario that ran: lost 0, identical, no foreign write, a
    partition noticed within 30 s and a second driver within 5 s."""
    out = {}
    for name, figures in found.items():
        ok = figures.get("requests_lost") == 0 and figures.get("identical_to_clean") is True \
            and figures.get("foreign_writes") == 0 and not figures.get("false_cut_offs")
        limit = {"partition": 30.0, "dual_driver": 5.0}.get(name)
        if limit is not None:
            ok = ok and figures.get("detect_s") is not None and figures["detect_s"] <= limit
        out[name] = bool(ok)
    return out
