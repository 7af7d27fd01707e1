"""``spotlight bench simulate``: time and cost to target at paper scale, for Spotlight and its
baselines, over a real spot trace -- and the simulator checked against a measured run first.

1. *Validation*: a digits run on the embedded cluster (``--run URL`` replays existing runs
   instead) is replayed through the simulator from its recorded task durations and worker
   counts; the simulated mean iteration time is set against the measured one.
2. *Systems*: every system of the scenario (``configs/sim/qwen-image-512.yaml`` by default) on
   the scenario's trace, twice: with the iteration ratios bench convergence measured here
   (``bench``) and with the ratio the paper's headline implies (``paper``).
3. *Sweeps*: spot:on-demand ratio, preemption rate (the trace played faster), notice length,
   resolution, cloud and trace; a PNG per sweep and a timeline PNG of one iteration per system.
4. *Scaling*: the simulator's own seconds against GPUs and iterations.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.bench.simulate_plot import plot_sweeps, plot_timelines
from pipelines.front.session import Session
from spotlight.config import from_stored, load_config, shipped_config
from spotlight.iteration import explore_window
from spotlight.sim.config import CLOUDS, load_sim_config
from spotlight.sim.replay import RecordedIteration, validate_replay
from spotlight.sim.report import implied_ratio, paper_config, simulate
from storage import RunStore
from storage.errors import NotCommittedError
from storage.manifest import stage_name

PAPER_HEADLINE_SPEEDUP = 4.0   # "reaches the same validation score 4x faster" (the paper)
SWEEPS = {
    "spot_ratio": ("cluster.spot_ratio", [0.5, 1.0, 2.0, 4.0]),
    "preemption_rate": ("cluster.trace_speedup", [1.0, 4.0, 16.0, 64.0]),
    "notice_s": ("cluster.notice_s", [0.0, 30.0, 120.0]),
    "cloud": ("cluster.cloud", list(CLOUDS)),
}
RESOLUTIONS = {"512": "sim/qwen-image-512.yaml", "1280": "sim/qwen-image-1280.yaml"}
# The measured run: the digits world on the embedded cluster (1 gpu + 1 spot worker), Spotlight
# with its exploration on the spot worker, validating only after its last iteration.
REPLAY_SETTINGS = {"validation.every": 1000, "cluster.dashboard": False}


def recorded_run(url: str) -> tuple[list[RecordedIteration], dict]:
    """A run store's iterations (wall time, validated or not, tasks) and how it ran."""
    try:
        store = RunStore.open(url, create=False)
    except NotCommittedError as exc:
        raise ValueError(f"--run {url}: {exc}; give the URL of a run that a Session started "
                         "(runs/<time>-<hash>)") from exc
    info = store.manifest.read().get("run", {})
    if "config" not in info:
        raise ValueError(f"--run {url}: no recorded config there; give the URL of a run that "
                         "a Session started (runs/<time>-<hash>)")
    config = from_stored(info["config"], info.get("source", url))
    iterations, k = [], 0
    while (record := store.stage_record(stage_name(k, "iteration"))) is not None:
        result = record["info"]["result"]
        tasks = store.get_json(stage_name(k, "iteration"), "tasks")["tasks"]
        if store.stage_record(stage_name(k, "explore-sync")) is not None:   # sync mode's
            tasks = tasks + store.get_json(stage_name(k, "explore-sync"), "candidates")["tasks"]
        iterations.append(RecordedIteration(result["end"] - result["start"],
                                            result["val_reward"] is not None, tuple(tasks)))
        k += 1
    if not iterations:
        raise ValueError(f"--run {url}: the run has no completed iteration to replay")
    facts = {"url": url, "mode": info.get("mode", config.mode),
             "gpu_workers": config.cluster.gpu_workers,
             "spot_workers": config.cluster.spot_workers,
             "window": explore_window(config, info.get("mode", config.mode)),
             "deadline": config.exploration.deadline}
    return iterations, facts


def measured_run(folder: Path, iterations: int) -> str:
    """Run the digits world on the embedded cluster; return the run's URL."""
    cfg = load_config(shipped_config("digits.yaml"), REPLAY_SETTINGS)
    url = str(folder / "measured")
    with Session.from_config(cfg, store=url, mode="spotlight") as session:
        session.run(iterations)
    return url


def validation(runs: list[str]) -> dict:
    """Replay each run; the figures of the first are the headline, all are listed."""
    checks = []
    for url in runs:
        iterations, facts = recorded_run(url)
        check = validate_replay(iterations, gpu_workers=facts["gpu_workers"],
                                spot_workers=facts["spot_workers"] if facts["mode"] in (
                                    "spotlight", "rlboost") else 0,
                                window=facts["window"], deadline=facts["deadline"])
        checks.append({**facts, **check})
    head = checks[0]
    return {"measured_s": head["measured_s"], "simulated_s": head["simulated_s"],
            "error": head["error"], "error_without_driver": head["error_without_driver"],
            "driver_s_per_stage": head["driver_s_per_stage"], "runs": checks}


def sweep(config, key: str, values: list) -> list[dict]:
    """The systems' speedup and cost ratio against on-demand at each value of ``key``."""
    points = []
    for value in values:
        result = simulate(config.with_values({key: value}))
        points.append({"value": value, **_ratios(result)})
    return points


def _ratios(result: dict) -> dict:
    keep = ("speedup_vs_ondemand", "cost_ratio_vs_ondemand", "throughput_vs_ondemand",
            "cost_efficiency_vs_ondemand")
    return {k: result[k] for k in keep} | {
        "spot_idle_share_during_training": {
            name: s["spot_idle_share_during_training"] for name, s in result["systems"].items()}}


def scaling(config) -> list[dict]:
    """The simulator's seconds for on-demand and Spotlight against GPUs and iterations."""
    out = []
    for gpus, iterations in ((8, 100), (32, 100), (128, 100), (8, 1000), (128, 1000)):
        cfg = config.with_values({
            "cluster.ondemand_gpus": gpus, "systems": ["ondemand", "spotlight"],
            "max_iterations": iterations, "convergence.ondemand_iterations": 10**6,
            "workload.prompts_per_iteration": max(32, gpus * 2)})
        result = simulate(cfg)
        out.append({"gpus": gpus * 2, "ondemand_gpus": gpus, "iterations": iterations,
                    "sim_wall_s": result["sim_wall_s"]})
    return out


@register_bench("simulate")
def bench_simulate(config: str | None = None, json_path: str | None = None, quick: bool = False,
                   trace: str | None = None, overrides: dict | None = None,
                   runs: list[str] | None = None, **_: object) -> dict:
    started = time.monotonic()
    settings = dict(overrides or {})
    if trace is not None:
        settings["cluster.trace"] = str(Path(trace).resolve())
    base = load_sim_config(config or shipped_config(RESOLUTIONS["512"]), settings)
    if quick:
        base = base.with_values({"convergence.ondemand_iterations": 30, "max_iterations": 200})
    folder = Path(tempfile.mkdtemp(prefix="spotlight-bench-simulate-"))
    out = Path(json_path).with_suffix("") if json_path else folder / "simulate"
    try:
        print("validation: replaying a measured run", flush=True)
        checked = validation(runs or [measured_run(folder, 4 if quick else 8)])
        print(f"  measured {checked['measured_s']:.2f} s an iteration, simulated "
              f"{checked['simulated_s']:.2f} s (error {checked['error']:.1%})", flush=True)
        result = {"bench": "simulate", "config": base.source, "validation": checked,
                  **_scenarios(base, quick, str(out))}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["wall_s"] = time.monotonic() - started
    result["machine"] = machine()
    if json_path:
        write_result(result, json_path)
    return result


def _scenarios(base, quick: bool, out: str) -> dict:
    t0 = time.perf_counter()
    bench = simulate(base, timeline_iteration=3)
    ratio = implied_ratio(base, bench, PAPER_HEADLINE_SPEEDUP)
    paper = simulate(paper_config(base, ratio))
    print(f"systems ({base.name}): " + ", ".join(
        f"{k} x{v:.2f}" for k, v in bench["speedup_vs_ondemand"].items() if v), flush=True)
    sweeps: dict[str, dict] = {}
    for resolution, name in RESOLUTIONS.items():
        cfg = load_sim_config(shipped_config(name), {"cluster.trace": str(base.path(
            base.cluster.trace) or "")} if base.cluster.trace else None)
        cfg = cfg.with_values({"convergence.ondemand_iterations":
                               base.convergence.ondemand_iterations,
                               "max_iterations": base.max_iterations})
        sweeps.setdefault("resolution", {})[resolution] = _ratios(simulate(cfg))
    traces = {"none": ""} | ({Path(base.cluster.trace).stem: str(base.path(base.cluster.trace))}
                             if base.cluster.trace else {})
    sweeps["trace"] = {name: _ratios(simulate(base.with_values({"cluster.trace": path})))
                       for name, path in traces.items()}
    for name, (key, values) in SWEEPS.items():
        print(f"sweep {name}", flush=True)
        sweeps[name] = {"key": key, "points": sweep(base, key, values[:2] if quick else values)}
    timelines = bench.pop("timelines")
    paper.pop("timelines")
    pngs = {"sweeps": plot_sweeps(sweeps, f"{out}-sweeps.png"),
            "timeline": plot_timelines(timelines, f"{out}-timeline.png")}
    return {
        "scenario": base.name,
        "systems": bench["systems"],
        "speedup_vs_ondemand": bench["speedup_vs_ondemand"],
        "cost_ratio_vs_ondemand": bench["cost_ratio_vs_ondemand"],
        "throughput_vs_ondemand": bench["throughput_vs_ondemand"],
        "cost_efficiency_vs_ondemand": bench["cost_efficiency_vs_ondemand"],
        "prices_per_gpu_hour": bench["prices_per_gpu_hour"], "trace": bench["trace"],
        "scenarios": {
            "bench": {k: bench[k] for k in ("speedup_vs_ondemand", "cost_ratio_vs_ondemand")},
            "paper": {"implied_iteration_ratio": ratio, "systems": paper["systems"],
                      **{k: paper[k] for k in ("speedup_vs_ondemand", "cost_ratio_vs_ondemand")}},
        },
        "sweeps": sweeps,
        "scaling": [] if quick else scaling(base),
        "png": pngs,
        "sim_wall_s": time.perf_counter() - t0,
    }
