"""``spotlight bench overhead``: what the Dask pipeline costs over the same work in one process.

Three runs from the same base model and seeds, each streaming latents and saving checkpoints:
1. in-process: the iteration program's in-process executor (the workers' task functions called
   in order, no Dask), one torch thread like a worker;
2. ``vanilla`` on the embedded cluster (1 gpu + 1 spot worker): the same iterations as futures;
3. ``spotlight`` on the same cluster: the rollout pulled by both workers, stale-weight
   exploration on the spot worker while the gpu worker trains;
4. ``rlboost``: the rollout pulled by both workers, no exploration.
``overhead_ratio`` = (2) / (1); ``critical_path_ratio`` = (3) / (2) iteration wall time;
``exploration_overlap`` = share of exploration task time while the gpu worker worked on the
iteration (rollout to checkpoint), from (3); ``rollout_speedup`` = rollout wall time (2) / (4);
``spot_idle_during_training`` = share of the training time the spot worker ran nothing, (4)
and (3).
The runs are repeated in rounds (three by default, the order reversed every other round) and the
ratios are taken over the sums.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.front.session import Session
from pipelines.front.timeline import (
    CRITICAL_STAGES,
    idle_share,
    overlap_fraction,
    plot_timeline,
    stage_spans,
)
from pipelines.run.inprocess import InProcessRun
from spotlight.config import RunConfig, load_config, shipped_config
from spotlight.models.base import base_policy
from spotlight.rewards import build_reward

MODES = ("vanilla", "spotlight", "rlboost")


def inprocess_iterations(config: RunConfig, url: str, iterations: int) -> list[float]:
    """The iteration program run in this process (vanilla, streaming latents and saving
    checkpoints like a cluster run); wall seconds per iteration."""
    run = InProcessRun(config, "vanilla", store=url, stream_latents=True)
    try:
        return [it.wall_s for it in run.run_iterations(iterations).iterations]
    finally:
        run.close()


def _session_run(config: RunConfig, mode: str, url: str,
                 iterations: int) -> tuple[list, list, float]:
    """Results, task records, and the driver's manifest reads per iteration while it ran."""
    cfg = config.with_values({"cluster.dashboard": False})
    with Session.from_config(cfg, store=url, mode=mode) as session:
        before = session.store.manifest.reads
        session.run(iterations)
        reads = (session.store.manifest.reads - before) / max(iterations, 1)
        return session.results, session.task_records(), reads


@register_bench("overhead")
def bench_overhead(quick: bool = False, config: str | None = None, iterations: int | None = None,
                   task: str = "ocr", json_path: str | None = None, rounds: int | None = None,
                   overrides: dict | None = None, **_: object) -> dict:
    started = time.monotonic()
    user_overrides, overrides = overrides or {}, {"validation.every": 4}
    if quick and config is None:
        # Half the batch, so the training window still holds a few exploration requests.
        overrides.update({"grpo.prompts_per_iteration": 8, "grpo.group_size": 4,
                          "grpo.micro_batch": 32, "validation.max_prompts": 8,
                          "exploration.candidates": 8, "exploration.request_batch": 4})
    cfg = load_config(config or shipped_config("digits.yaml"), {**overrides, **user_overrides})
    iterations = iterations or (2 if quick else 8)
    base_policy(cfg, progress=False)   # digits: pretrained once, into the cache
    build_reward(cfg.reward)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-overhead-"))
    timeline = Path(json_path).with_suffix(".timeline.png") if json_path else \
        root / "timeline.png"
    runs = Runs()
    result: dict = {}
    # Rounds alternate the order (in-process, then the modes, then the reverse): a slow drift
    # of a shared machine then weighs on every run alike, not on whichever ran last.
    for r in range(rounds or (1 if quick else 3)):
        for run in ("inprocess", *MODES)[:: 1 if r % 2 == 0 else -1]:
            url = str(root / f"{run}-{r}")
            if run == "inprocess":
                runs.inprocess += inprocess_iterations(cfg, url, iterations)
            else:
                runs.add(run, *_session_run(cfg, run, url, iterations))
        if r == 0:
            plot_timeline(runs.first_spotlight, timeline, title="bench overhead: spotlight mode")
        result = {"bench": "overhead", "config": cfg.source, "iterations": iterations,
                  "rounds": r + 1, **overhead_figures(cfg, runs),
                  "timeline_png": str(timeline), "runs": str(root),
                  "wall_s": time.monotonic() - started, "machine": machine()}
        if json_path:   # the rounds so far, should the bench be cut short
            write_result(result, json_path)
    return result


@dataclass
class Runs:
    """What the rounds measured so far: in-process iteration seconds; per mode the iteration
    results and task records; the driver's manifest reads per iteration (spotlight)."""

    inprocess: list[float] = field(default_factory=list)
    results: dict[str, list] = field(default_factory=lambda: {m: [] for m in MODES})
    tasks: dict[str, list[list]] = field(default_factory=lambda: {m: [] for m in MODES})
    reads: list[float] = field(default_factory=list)
    first_spotlight: list = field(default_factory=list)   # the timeline's: the first round's

    def add(self, mode: str, results: list, records: list, reads: float) -> None:
        self.results[mode] += results
        self.tasks[mode].append(records)   # per run: iterations are numbered per run
        if mode == "spotlight":
            self.reads.append(reads)
            self.first_spotlight = self.first_spotlight or records


def overhead_figures(cfg: RunConfig, runs: Runs) -> dict:
    """The bench's ratios over every round so far."""
    spot, vanilla = runs.results["spotlight"], runs.results["vanilla"]
    # Iterations that explored for a next one (all but the last) against the same vanilla ones.
    explored = [i for i, r in enumerate(spot) if r.planned]
    spot_wall = sum(spot[i].wall_s for i in explored)
    vanilla_wall = sum(vanilla[i].wall_s for i in explored)
    dask_s, inprocess_s = sum(r.wall_s for r in vanilla), sum(runs.inprocess)
    rollout_s = {m: sum(sum(stage_spans(tasks, "rollout").values()) for tasks in runs.tasks[m])
                 for m in MODES}
    return {
        "placement": {m: list(cfg.placed("rollout", m)) for m in MODES},
        "inprocess_s": inprocess_s, "dask_s": dask_s, "overhead_ratio": dask_s / inprocess_s,
        "exploration_overlap": overlap_fraction(
            [t for tasks in runs.tasks["spotlight"] for t in tasks], inner="explore",
            outer=CRITICAL_STAGES),
        "critical_path_ratio": spot_wall / vanilla_wall if vanilla_wall else None,
        # The rollout on the gpu worker alone (vanilla) against pulled by gpu + spot (rlboost),
        # first request's start to last request's end; and whole iterations the same way.
        "rollout_s": rollout_s,
        "rollout_speedup": rollout_s["vanilla"] / rollout_s["rlboost"],
        "iteration_speedup_rlboost": dask_s / sum(r.wall_s for r in runs.results["rlboost"]),
        # Share of the training time the spot workers ran nothing: what exploration recovers.
        "spot_idle_during_training": {m: idle_share(runs.tasks[m], "spot")
                                      for m in ("rlboost", "spotlight")},
        **{f"{m}_iteration_s": [r.wall_s for r in runs.results[m]] for m in MODES},
        "inprocess_iteration_s": runs.inprocess,
        "explored_candidates": sum(r.explored for r in spot),
        "planned_candidates": sum(r.planned for r in spot),
        "filled_seeds": sum(r.filled for r in spot),
        # GETs of manifest.json by the driver per iteration (spotlight mode): the driver is its
        # only writer and keeps its own copy, so it reads it once when it opens the run.
        "manifest_reads_per_iteration": max(runs.reads) if runs.reads else None,
        "cost_usd": {m: runs.results[m][-1].cost_total_usd for m in MODES},
    }
