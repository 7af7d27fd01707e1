"""``spotlight bench convergence``: does exploration reach a target validation reward sooner, and
by how much, over paired seeds with intervals.

Two measurements, joined:
1. *Iteration efficiency*, many seeds: every mode runs under the same K run seeds (same base
   model, prompts and validation seeds) in the in-process harness, which computes the
   cluster's numbers bit for bit (``pipelines/run/inprocess.py``), two jobs at a time, until it
   has both run the fixed budget (where the area under the curve and the value at the budget
   are read) and reached the target, or for at most ``--iterations``. Each job is saved when it
   ends; ``--resume`` continues a cut-off bench.
2. *Time per iteration*, on the embedded cluster (1 gpu + 1 spot worker), first: the first
   seed's runs of every mode until the target or the budget, with the stale exploration on the
   spot worker from the start of the iteration (spot capacity of its own, as deployed). Their
   critical-path seconds per iteration turn iterations to target into time and dollars; their
   own wall time (to the target, or of the budget's iterations) is the check on that product.

The modes: ``vanilla`` random seeds; ``sync`` explores with the current weights before the
rollout (fresh, on the critical path); ``stale`` explores with the previous iteration's weights
off it -- these three at equal exploration budget (the same candidates and replay steps), so
``staleness_cost`` is stale's iterations over fresh's. ``spotlight`` is the product: stale
exploration with the planner, which picks the candidates and replay steps per iteration to fit
the exploration window the ``stale`` cluster run measured (``spotlight-xR``: on R times the spot
capacity), so its seconds per iteration are that run's less the time each of its iterations
waited for the next one's exploration (the fixed arm may not fit the window; a plan does).
That cluster run is made whether or not ``stale`` is one of the modes; its harness jobs (the
dearest, and not needed for the planned modes' figures) only if it is.
The exploration deadline is off: the harness replays every planned candidate.

Each mode may also run behind another training objective (:mod:`pipelines.bench.bench_modes`:
``nft-vanilla`` is DiffusionNFT's objective without exploration, the strong baseline;
``nft-spotlight`` Spotlight's exploration on top of it), so what exploration adds is measured
against the best objective alone, not only against vanilla Flow-GRPO.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from pipelines.bench.bench_modes import (
    SEED_MODES,
    known_mode,
    objective_settings,
    planned_ratio,
    seed_mode,
    session_mode,
    stale_of,
    timing_modes,
)
from pipelines.bench.convergence_report import summarize
from pipelines.bench.convergence_table import markdown_table
from pipelines.bench.convergence_time import plain_iterations, stage_seconds
from pipelines.bench.learning import TASK_CONFIGS
from pipelines.bench.paired import Job, PairedPlan, PairedStore, cluster_part, run_jobs
from pipelines.bench.registry import register_bench, write_result
from pipelines.bench.shipped import models_from, ship_models
from pipelines.front.session import Session
from pipelines.observe.run_view import RunView
from spotlight.config import RunConfig, load_config
from spotlight.exploration.planner import exploration_window_s
from spotlight.models.base import base_policy
from spotlight.models.prompts import world_prompts
from spotlight.rewards import build_reward, check_rewards
from spotlight.rl.validation import standard_error, validate

DEFAULT_MODES = ("vanilla", "sync", "stale", "spotlight")
# The default target: the base's validation reward plus this. GenEval's world gains more early
# (every mode had passed base + 0.02 at its first validation, iteration 5: a crossing that
# separates nothing), so its target sits higher (docs/results.md 2026-11-26).
TASK_TARGET_GAIN = {"ocr": 0.02, "geneval": 0.05}
# The bench's yardstick: a larger fixed validation set (256 validation prompts, four fixed seeds
# each) every five iterations -- on 64 prompts the OCR base's standard error was 0.0193, about
# the whole target gain -- and the planner only where a mode asks for it (see the docstring).
# The base pretrains for exactly pretrain.steps (no wall-clock cap), so it is the same base on
# every run here -- and bench learning's, which shares the cached model; the bench keeps a copy
# with its parts for other machines (pipelines.bench.shipped).
BENCH_SETTINGS = {"validation.every": 5, "validation.seeds_per_prompt": 4,
                  "validation.max_prompts": 256,
                  "planner.enabled": False, "exploration.deadline": False,
                  "pretrain.time_budget_s": 86400.0}
# On the cluster: the rollout on the gpu worker, exploration on the spot worker from the
# iteration's start -- the spot worker's capacity is exploration's own.
CLUSTER_SETTINGS = {"placement.rollout": ["gpu"], "exploration.window": "iteration",
                    "cluster.dashboard": False}
QUICK_SETTINGS = {"grpo.prompts_per_iteration": 4, "grpo.group_size": 4, "grpo.micro_batch": 16,
                  "validation.max_prompts": 8, "validation.seeds_per_prompt": 2,
                  "validation.every": 1, "exploration.candidates": 8,
                  "exploration.request_batch": 4}


def base_validation(config: RunConfig) -> tuple[float, float]:
    """The base model's validation reward and its standard error (prompts as the unit):
    deterministic ODE samples on fixed seeds (not the run seed's), so it is where every mode and
    every seed starts. Computed with the gpu workers' thread count, so the floating-point sums
    match theirs."""
    torch.set_num_threads(config.cluster.threads_per_worker)
    prompts = world_prompts(config, "val")
    result = validate(base_policy(config, progress=False), prompts, build_reward(config.reward),
                      check_rewards, config)
    return result.mean_reward, standard_error(result.rewards)


def run_until(config: RunConfig, mode: str, url: str, target: float | None,
              max_iterations: int) -> dict:
    """One mode on the embedded cluster from the base model until ``target`` (validation reward)
    or ``max_iterations``: its validation curve and every iteration's wall time."""
    cfg = config.with_values(CLUSTER_SETTINGS)
    with Session.from_config(cfg, store=url, mode=session_mode(mode)) as session:
        reached = None
        for _ in range(max_iterations):
            session.submit_iteration(max_iterations).result()
            last = session.results[-1]
            print(f"cluster {mode:9s} seed {cfg.seed} iter {last.iteration:3d} "
                  f"{last.wall_s:5.1f}s"
                  + (f" val={last.val_reward:.3f}" if last.val_reward is not None else ""),
                  flush=True)
            if target is not None and last.val_reward is not None and last.val_reward >= target:
                reached = last.iteration + 1
                break
        results, curve = session.results, session.val_curve()
        records = session.task_records()
    t0 = results[0].start
    run = {"val_curve": [[c["iteration"], c["val_reward"]] for c in curve],
           "iteration_s": [r.wall_s for r in results],
           "explore_wait_s": [r.explore_wait_s or 0.0 for r in results],
           "validated": [r.val_reward is not None for r in results],
           "iterations_to_target": reached,
           "time_to_target_s": (results[reached - 1].end - t0) if reached else None,
           "wall_s": results[-1].end - t0,
           "time_model": measured_time_model(records, cfg.exploration.window)}
    return {**run, "stage_s": stage_seconds(records, plain_iterations(run))}


def measured_time_model(records: list[dict], window: str) -> list[float | None] | None:
    """What a planner in the harness plans with, as this run measured it: the median
    exploration window (rollout start to training end, or training alone), the spot
    workers' seconds per candidate and denoising step, and the median rollout of the
    iterations that sampled one (None if none did); None without exploration."""
    by_iteration: dict[int, dict[str, list[dict]]] = {}
    for r in records:
        by_iteration.setdefault(r["iteration"], {}).setdefault(r["stage"], []).append(r)
    windows = []
    for stages in by_iteration.values():
        rollout = stages.get("rollout") and min(stages["rollout"], key=lambda r: r["start"])
        train = stages.get("train") and stages["train"][0]
        seconds = exploration_window_s(rollout or None, train or None, window)
        if seconds is not None:
            windows.append(seconds)
    explored = [r for r in records if r["stage"] == "explore" and r.get("samples")]
    work = sum(r["samples"] * r["steps"] for r in explored)
    if not windows or not work:
        return None
    return [float(np.median(windows)), sum(r["end"] - r["start"] for r in explored) / work,
            sampled_rollout_s(by_iteration)]


def sampled_rollout_s(by_iteration: dict[int, dict[str, list[dict]]]) -> float | None:
    """The median first-to-last span of the rollout tasks of the iterations that sampled
    their rollout (not trained on explored samples); None if none did."""
    spans = [max(r["end"] for r in rollout) - min(r["start"] for r in rollout)
             for stages in by_iteration.values()
             for rollout in [stages.get("rollout", [])]
             if rollout and not any(r.get("explored") for r in rollout)]
    return float(np.median(spans)) if spans else None


def cluster_check(plan: PairedPlan, store: PairedStore, mode: str, seed: int,
                  target: float) -> bool:
    """``mode``/``seed`` on the embedded cluster until the target or the budget, whichever is
    first (saved as ``cluster-MODE-seedS``); False if it was saved already. The budget caps it
    because what it measures -- seconds per iteration, and the wall time of iterations against
    that -- needs a few plain iterations, not a far crossing: past the budget the check
    compares the wall time of the budget's iterations instead of the time to target."""
    name = cluster_part(mode, seed)
    if name in store.loaded:
        return False
    url = run_folder(store, name)
    shutil.rmtree(url, ignore_errors=True)   # a cut-off cluster run starts over
    config = plan.config.with_values({"seed": seed, **objective_settings(mode)})
    store.save(name, run_until(config, mode, str(url), target, plan.budget or plan.iterations))
    return True


def _check_options(task: str, config: str | None, seeds: int, modes: tuple[str, ...],
                   iterations: int | None) -> None:
    if task not in TASK_CONFIGS and config is None:
        raise ValueError(f"--task {task!r} is not known; choose one of {sorted(TASK_CONFIGS)}")
    if seeds < 1:
        raise ValueError(f"--seeds {seeds} must be at least 1 (paired run seeds per mode)")
    unknown = [m for m in modes if not known_mode(m)]
    if unknown or len(set(modes)) != len(modes):
        raise ValueError(f"--modes {','.join(modes)}: each mode once, from {', '.join(SEED_MODES)} "
                         "or spotlight-xR (the planner with R times the spot capacity), each "
                         "optionally behind an objective: nft-MODE (DiffusionNFT's objective), "
                         "reuse-MODE (nft on the explored samples), fast-MODE (a two-step SDE "
                         "window)")
    if iterations is not None and iterations < 1:
        raise ValueError(f"--iterations {iterations} must be at least 1")


def _check_budget(budget: int, iterations: int, every: int) -> None:
    if not 1 <= budget <= iterations or budget % every:
        raise ValueError(f"--budget {budget} must be a multiple of the validation interval "
                         f"({every}) between 1 and --iterations ({iterations}): the area and "
                         "the value at the budget are read at a validation")


@register_bench("convergence")
def bench_convergence(task: str = "ocr", quick: bool = False, config: str | None = None,
                      json_path: str | None = None, target: float | None = None,
                      target_gain: float | None = None, seeds: int | None = None,
                      overrides: dict | None = None, modes: list[str] | None = None,
                      iterations: int | None = None, workers: int | None = None,
                      resume: bool = False, cluster_seeds: int = 1, budget: int | None = None,
                      product: str | None = None, **_: object) -> dict:
    seeds = seeds or (1 if quick else 8)
    modes = tuple(modes or DEFAULT_MODES)
    _check_options(task, config, seeds, modes, iterations)
    if product is not None and product not in modes:
        raise ValueError(f"--product {product} is not one of --modes {','.join(modes)}; name "
                         "the mode whose speed-up the headline reports")
    product = product or "spotlight"
    settings = dict(overrides or {})
    cluster_seeds = min(cluster_seeds, seeds)
    cfg = load_config(config or TASK_CONFIGS[task],
                      {**BENCH_SETTINGS, **(QUICK_SETTINGS if quick else {}), **settings})
    iterations = iterations or (2 if quick else 30)
    budget = budget or min(iterations, 2 if quick else 10)
    _check_budget(budget, iterations, cfg.validation.every)
    started = time.monotonic()
    folder = (Path(json_path).with_suffix(".parts") if json_path
              else Path(tempfile.mkdtemp(prefix="spotlight-bench-convergence-")))
    with models_from(folder / "models"):   # the base and reward model the parts come from
        shipped = ship_models(folder / "models", cfg, lambda: base_validation(cfg))
        base, base_se = shipped.base_val_reward, shipped.base_val_standard_error
        if target_gain is None:
            target_gain = TASK_TARGET_GAIN.get(cfg.world.task, 0.02)
        goal = target if target is not None else base + target_gain
        print(f"base validation reward {base:.3f} (standard error {base_se:.4f}); target "
              f"{goal:.3f}", flush=True)
        every = cfg.validation.every
        plan = PairedPlan(cfg, iterations, every, base,
                          lag_points=tuple(k for k in range(2 * every, iterations + 1, 2 * every)),
                          target=goal, budget=budget)
        store = PairedStore.open(folder, plan, resume)
        png = Path(json_path).with_suffix(".png") if json_path else folder / "convergence.png"
        facts = {"task": cfg.world.task, "config": cfg.source, "base_val_reward": base,
                 "base_val_standard_error": base_se,
                 "standard_error_under_half_the_gain": bool(base_se < (goal - base) / 2),
                 "target": goal, "seeds_asked": seeds, "modes": list(modes),
                 "iterations": iterations, "budget": budget, "validation_every": every,
                 "overrides": settings, "png": str(png), "parts": str(folder),
                 "prompts_per_iteration": cfg.grpo.prompts_per_iteration,
                 "candidates": cfg.exploration.candidates, "group_size": cfg.grpo.group_size,
                 "product": product, "models_made_on": shipped.made_on}
        seed_list = [cfg.seed + s for s in range(seeds)]

        def report() -> dict:
            result = summarize(store.loaded, facts, seed_list, cfg, png)
            result["wall_s"] = time.monotonic() - started
            if json_path:   # whatever has finished, should the bench be cut short
                write_result(result, json_path)
            return result

        run_phases(plan, store, modes, seed_list, seed_list[:cluster_seeds],
                   workers or min(2, os.cpu_count() or 1), goal, report)
        print(markdown_table(result := report()), flush=True)   # the JSON follows it
        return result


def longest_first(modes: tuple[str, ...]) -> list[str]:
    """``modes`` in the order their jobs are started: the dearer first (stale exploration and
    its audits, then fresh exploration, then none), so two workers finish a seed together."""
    cost = {"vanilla": 2, "rlboost": 2, "sync": 1}
    return sorted(modes, key=lambda m: (cost.get(seed_mode(m), 0), modes.index(m)))


def run_phases(plan: PairedPlan, store: PairedStore, modes: tuple[str, ...],
               seed_list: list[int], checked: list[int], workers: int, goal: float,
               report: Callable[[], dict]) -> None:
    """The checked seeds' cluster runs first, on an otherwise idle machine (they measure time,
    and the planned modes plan on the stale run's), then every harness job in one pool,
    seed by seed and the dearer modes first: a bench cut off early has its time figures and
    whole seeds, and only the last jobs leave a core idle."""
    timed = [m for m in modes if planned_ratio(m) is None]
    # A planned mode plans on its stale mode's cluster run: that run is timed even where the
    # stale mode's own harness jobs (the fixed arm's learning, the dearest jobs) were not asked.
    timed += sorted(timing_modes(modes) - set(timed))
    for seed in checked:
        for mode in timed:
            if cluster_check(plan, store, mode, seed, goal):
                report()
            keep_stage_seconds(store, cluster_part(mode, seed))
    models = {stale: time_model(plan, store, stale, seed_list[0], goal)
              for stale in {stale_of(m) for m in modes if m not in timed}}
    run_jobs(plan, [Job(m, s, None if planned_ratio(m) is None else models[stale_of(m)])
                    for s in seed_list for m in longest_first(modes)], store, workers,
             on_done=report)


def run_folder(store: PairedStore, name: str) -> Path:
    """Where cluster part ``name``'s run keeps its store (beside the parts; not committed)."""
    return store.folder / "runs" / name


def keep_stage_seconds(store: PairedStore, name: str) -> None:
    """A cluster part saved before its gpu path's seconds by stage were kept gets them from
    its run's task records while that run's folder is here (the parts are committed, the runs
    are not), so a later summary needs the parts alone."""
    run = store.loaded.get(name)
    if run is None or "stage_s" in run:
        return
    folder = run_folder(store, name)
    if not (folder / "manifest.json").exists():
        return
    records = RunView.open(str(folder)).tasks()
    store.save(name, {**run, "stage_s": stage_seconds(records, plain_iterations(run))})


def time_model(plan: PairedPlan, store: PairedStore, stale: str, seed: int,
               goal: float) -> tuple[float, float]:
    """What the planned modes of ``stale``'s objective plan with: its cluster run's measured
    exploration window and seconds per candidate step."""
    name = cluster_part(stale, seed)
    if "time_model" not in store.loaded.get(name, {"time_model": 0}):
        store.loaded.pop(name)   # saved by a Spotlight that did not measure it: measure again
        cluster_check(plan, store, stale, seed, goal)
    model = store.loaded.get(name, {}).get("time_model")
    if model is not None and len(model) == 2:   # saved before the rollout's time was kept
        run = RunView.open(str(run_folder(store, name)))
        model = measured_time_model(run.tasks(), CLUSTER_SETTINGS["exploration.window"])
        store.save(name, {**store.loaded[name], "time_model": model})   # the parts suffice
    if model is None:
        raise RuntimeError(f"the {stale} cluster run measured no exploration, so the spotlight "
                           "modes have no time to plan with")
    return tuple(model)
