"""``spotlight bench convergence``: time to a target validation reward, three modes, one cluster.

``vanilla`` (random seeds), ``sync`` (exploration with current weights on the gpu workers,
before the rollout) and ``spotlight`` (stale-weight exploration on the spot workers while
training runs) start from the same base model on the same embedded cluster shape (1 gpu + 1
spot worker, one thread each) with the same seeds, and each runs until it reaches the target
validation reward or its wall budget. The target defaults to the base model's validation
reward plus ``--target-gain``.
"""
from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.bench import machine, register_bench
from pipelines.session import Session
from spotlight.config import RunConfig, load_config
from spotlight.models.pretrain import pretrain
from spotlight.rewards import build_reward

MODES = ("vanilla", "sync", "spotlight")
TASK_CONFIGS = {"ocr": "configs/digits.yaml", "geneval": "configs/digits-geneval.yaml"}


def run_until(config: RunConfig, mode: str, url: str, target: float | None, budget_s: float,
              max_iterations: int) -> dict:
    """One mode from the base model until ``target`` (validation reward) or the wall budget."""
    cfg = copy.deepcopy(config)
    cfg.mode = mode
    cfg.cluster.dashboard = False
    started = time.monotonic()
    with Session.from_config(cfg, store=url) as session:
        reached = None
        for _ in range(max_iterations):
            session.submit_iteration(max_iterations).result()
            last = session.results[-1]
            print(f"{mode:9s} iter {last.iteration:3d} {time.monotonic() - started:6.0f}s "
                  f"reward={last.reward_mean:.3f} group_std={last.group_reward_std:.3f}"
                  + (f" tau={last.kendall_tau:.2f}" if last.kendall_tau is not None else "")
                  + (f" val={last.val_reward:.3f}" if last.val_reward is not None else ""),
                  flush=True)
            if target is not None and last.val_reward is not None and last.val_reward >= target:
                reached = last.iteration + 1
                break
            if time.monotonic() - started > budget_s:
                break
        results, curve = session.results, session.val_curve()
        base = session.base_val_reward
    t0 = results[0].start
    taus = [r.kendall_tau for r in results if r.kendall_tau is not None]
    return {
        "base_val_reward": base,
        "val_curve": curve,
        "iterations": len(results),
        "iterations_to_target": reached,
        "time_to_target_s": (results[reached - 1].end - t0) if reached else None,
        "group_reward_std": float(np.mean([r.group_reward_std for r in results])),
        "kendall_tau": taus,
        "tau_iterations": [r.iteration for r in results if r.kendall_tau is not None],
        "budget_overrun": [r.plan_overrun for r in results if r.plan_overrun is not None],
        "fallback_iterations": [r.iteration for r in results if r.fidelity_state == "fallback"],
        "wall_s": results[-1].end - t0,
    }


def _speedup(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def plot_convergence(runs: dict[str, dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, run in runs.items():
        curve = run["val_curve"]
        left.plot([c["wall_s"] for c in curve], [c["val_reward"] for c in curve], marker="o",
                  ms=3, label=mode)
    if runs and (target := next(iter(runs.values())).get("target")) is not None:
        left.axhline(target, color="grey", ls="--", lw=1, label="target")
    left.set(xlabel="wall seconds", ylabel="validation reward", title="validation reward vs wall time")
    left.legend()
    spot = runs.get("spotlight", {})
    right.plot(spot.get("tau_iterations", []), spot.get("kendall_tau", []), marker="o", ms=3)
    right.axhline(0, color="grey", lw=0.5)
    right.set(xlabel="iteration", ylabel="Kendall tau", ylim=(-1.05, 1.05),
              title="rank fidelity: stale exploration vs rollout")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@register_bench("convergence")
def bench_convergence(task: str = "ocr", quick: bool = False, config: str | None = None,
                      time_budget_s: float | None = None, json_path: str | None = None,
                      target: float | None = None, target_gain: float = 0.05,
                      **_: object) -> dict:
    if task not in TASK_CONFIGS and config is None:
        raise ValueError(f"--task {task!r} is not known; choose one of {sorted(TASK_CONFIGS)}")
    overrides: dict = {"validation.every": 3}
    max_iterations = 10**6
    if quick:
        overrides.update({"grpo.prompts_per_iteration": 4, "grpo.group_size": 4,
                          "grpo.micro_batch": 16, "validation.max_prompts": 8,
                          "validation.every": 1, "exploration.candidates": 8,
                          "exploration.request_batch": 4})
        max_iterations = 2
    cfg = load_config(config or TASK_CONFIGS[task], overrides)
    budget = time_budget_s or (60.0 if quick else 600.0)
    pretrain(cfg)
    build_reward(cfg.reward)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-convergence-"))
    started = time.monotonic()
    runs: dict[str, dict] = {}
    for mode in MODES:
        goal = target
        if goal is None and runs:
            goal = next(iter(runs.values()))["target"]
        run = run_until(cfg, mode, str(root / mode), goal if goal is not None else np.inf,
                        budget, max_iterations)
        if goal is None:   # the first mode measured the base model: the target follows from it
            goal = run["base_val_reward"] + target_gain
            first = [c for c in run["val_curve"][1:] if c["val_reward"] >= goal]
            run["iterations_to_target"] = first[0]["iteration"] if first else None
            run["time_to_target_s"] = first[0]["wall_s"] if first else None
        run["target"] = goal
        runs[mode] = run
    t = {m: r["time_to_target_s"] for m, r in runs.items()}
    taus = np.asarray(runs["spotlight"]["kendall_tau"], dtype=float)
    taus = taus[np.isfinite(taus)]
    overruns = runs["spotlight"]["budget_overrun"]
    png = Path(json_path).with_suffix(".png") if json_path else root / "convergence.png"
    plot_convergence(runs, png, f"bench convergence: {cfg.world.task}")
    return {
        "bench": "convergence", "task": cfg.world.task, "config": cfg.source,
        "target_val_reward": runs["vanilla"]["target"],
        "time_to_target_s": t,
        "iterations_to_target": {m: r["iterations_to_target"] for m, r in runs.items()},
        "speedup_vs_vanilla": _speedup(t["vanilla"], t["spotlight"]),
        "speedup_vs_sync": _speedup(t["sync"], t["spotlight"]),
        "kendall_tau": {"median": float(np.median(taus)) if len(taus) else None,
                        "p10": float(np.percentile(taus, 10)) if len(taus) else None,
                        "iterations": len(taus)},
        "group_reward_std": {m: r["group_reward_std"] for m, r in runs.items()},
        "budget_overrun_fraction": float(np.mean(overruns)) if overruns else None,
        "val_curves": {m: r["val_curve"] for m, r in runs.items()},
        "fallback_iterations": runs["spotlight"]["fallback_iterations"],
        "wall_budget_s": budget, "png": str(png), "runs": str(root),
        "wall_s": time.monotonic() - started, "machine": machine(),
    }
