"""``spotlight bench convergence``: time to a target validation reward, three modes, one cluster.

``vanilla`` (random seeds), ``sync`` (exploration with current weights on the gpu workers,
before the rollout) and ``spotlight`` (stale-weight exploration on the spot workers while
training runs) start from the same base model on the same embedded cluster shape (1 gpu + 1
spot worker, one thread each) with the same seeds, and each runs until it reaches the target
validation reward or its wall budget. The target defaults to the base model's validation
reward plus ``--target-gain``, measured before any mode runs so every mode stops there.

One run per mode is one sample of a noisy process (which prompts come when, which noise): with
``--seeds K`` every mode runs under run seeds ``seed .. seed + K - 1`` and the headline times
and speedups are medians, with every seed's figures kept beside them.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pipelines.bench import machine, register_bench, write_result
from pipelines.front.session import Session
from spotlight.config import RunConfig, load_config, shipped_config
from spotlight.models.base import base_policy
from spotlight.models.prompts import world_prompts
from spotlight.rewards import build_reward, check_rewards
from spotlight.rl.validation import validate

MODES = ("vanilla", "sync", "spotlight", "rlboost")
DEFAULT_MODES = ("vanilla", "sync", "spotlight")
TASK_CONFIGS = {"ocr": shipped_config("digits.yaml"),
                "geneval": shipped_config("digits-geneval.yaml")}


def base_validation(config: RunConfig) -> float:
    """The base model's validation reward: deterministic ODE samples on fixed seeds (not the run
    seed's), so it is where every mode and every seed starts. Computed with the gpu workers'
    thread count, so the floating-point sums match theirs."""
    torch.set_num_threads(config.cluster.threads_per_worker)
    prompts = world_prompts(config, "val")
    return validate(base_policy(config, progress=False), prompts, build_reward(config.reward), check_rewards,
                    config).mean_reward


def _summary(values: list[float]) -> dict:
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    return {"median": float(np.median(values)) if len(values) else None,
            "p10": float(np.percentile(values, 10)) if len(values) else None,
            "audits": int(len(values)), "over": "random candidates, stale vs fresh (unbiased)"}


def run_until(config: RunConfig, mode: str, url: str, target: float | None, budget_s: float,
              max_iterations: int) -> dict:
    """One mode from the base model until ``target`` (validation reward) or the wall budget."""
    cfg = config.with_values({"cluster.dashboard": False})
    started = time.monotonic()
    with Session.from_config(cfg, store=url, mode=mode) as session:
        reached = None
        for _ in range(max_iterations):
            session.submit_iteration(max_iterations).result()
            last = session.results[-1]
            # Modes compare on the validation reward (fixed seeds, no selection) only: a mode
            # that selects seeds rolls out its most spread ones, so its rollout mean is not
            # comparable to vanilla's. The group std is what selection is for.
            print(f"{mode:9s} seed {cfg.seed} iter {last.iteration:3d} "
                  f"{time.monotonic() - started:6.0f}s "
                  + (f"val={last.val_reward:.3f} " if last.val_reward is not None else "val=  -   ")
                  + f"group_std={last.group_reward_std:.3f}"
                  + (f" tau_audit={last.audit_tau:.2f}" if last.audit_tau is not None else "")
                  + (f" tau_selected={last.kendall_tau:.2f}" if last.kendall_tau is not None
                     else "")
                  + (f" plan={last.plan_candidates}x{last.plan_steps}"
                     f" explored={last.explored}/{last.planned}" if last.planned else ""),
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
        "kendall_tau": taus,   # over the selected seeds: biased upwards by the selection
        "tau_iterations": [r.iteration for r in results if r.kendall_tau is not None],
        "audit_tau": [r.audit_tau for r in results if r.audit_tau is not None],   # unbiased
        "budget_overrun": [r.plan_overrun for r in results if r.plan_overrun is not None],
        "fallback_iterations": [r.iteration for r in results if r.fidelity_state == "fallback"],
        "wall_s": results[-1].end - t0,
    }


def _speedup(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def median_time(times: list[float | None]) -> float | None:
    """Median time to target over seeds; a seed that never got there counts as slower than any
    that did, and a median that lands on one is None (not reached)."""
    if not times:
        return None
    value = float(np.median([np.inf if t is None else t for t in times]))
    return value if np.isfinite(value) else None


def plot_convergence(runs: dict[str, list[dict]], target: float | None, path: Path,
                     title: str) -> Path:
    """Validation reward against wall time per mode (every seed), and τ over iterations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (mode, seeds) in enumerate(runs.items()):
        for j, run in enumerate(seeds):
            curve = run["val_curve"]
            left.plot([c["wall_s"] for c in curve], [c["val_reward"] for c in curve],
                      marker="o", ms=3 if j == 0 else 2, color=f"C{i}", alpha=1.0 if j == 0 else 0.4,
                      label=mode if j == 0 else None)
    if target is not None:
        left.axhline(target, color="grey", ls="--", lw=1, label="target")
    left.set(xlabel="wall seconds", ylabel="validation reward",
             title="validation reward vs wall time" + (" (faint: other seeds)"
                                                         if any(len(r) > 1 for r in runs.values())
                                                         else ""))
    left.legend()
    for j, spot in enumerate(runs.get("spotlight", [])):
        right.plot(spot["tau_iterations"], spot["kendall_tau"], marker="o", ms=3 if j == 0 else 2,
                   color="C0", alpha=1.0 if j == 0 else 0.4)
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
                      target: float | None = None, target_gain: float = 0.05, seeds: int = 1,
                      overrides: dict | None = None, modes: list[str] | None = None,
                      **_: object) -> dict:
    if task not in TASK_CONFIGS and config is None:
        raise ValueError(f"--task {task!r} is not known; choose one of {sorted(TASK_CONFIGS)}")
    if seeds < 1:
        raise ValueError(f"--seeds {seeds} must be at least 1 (run seeds per mode)")
    modes = tuple(modes or DEFAULT_MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown or len(set(modes)) != len(modes):
        raise ValueError(f"--modes {','.join(modes)}: each mode once, from {', '.join(MODES)}")
    settings = dict(overrides or {})
    overrides = {"validation.every": 3}
    max_iterations = 10**6
    if quick:
        overrides.update({"grpo.prompts_per_iteration": 4, "grpo.group_size": 4,
                          "grpo.micro_batch": 16, "validation.max_prompts": 8,
                          "validation.every": 1, "exploration.candidates": 8,
                          "exploration.request_batch": 4})
        max_iterations = 2
    overrides.update(settings)   # the caller's --set values win over the bench's own
    cfg = load_config(config or TASK_CONFIGS[task], overrides)
    budget = time_budget_s or (60.0 if quick else 600.0)
    base = base_validation(cfg)   # builds (digits: pretrains, cached) the base first
    goal = target if target is not None else base + target_gain
    print(f"base validation reward {base:.3f}; target {goal:.3f}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-convergence-"))
    started = time.monotonic()
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    png = Path(json_path).with_suffix(".png") if json_path else root / "convergence.png"
    facts = {"task": cfg.world.task, "config": cfg.source, "base_val_reward": base,
             "target_val_reward": goal, "seeds_asked": seeds, "modes": list(modes),
             "overrides": settings, "wall_budget_s": budget, "png": str(png), "runs": str(root)}
    result: dict = {}
    for offset in range(seeds):   # seed by seed, so an interrupted bench has whole comparisons
        seeded = cfg.with_values({"seed": cfg.seed + offset})
        for mode in modes:
            run = run_until(seeded, mode, str(root / f"{mode}-seed{seeded.seed}"), goal, budget,
                            max_iterations)
            runs[mode].append({"seed": seeded.seed, **run})
        result = summarize(runs, facts, started, png)
        if json_path and offset + 1 < seeds:   # the seeds so far, should the bench be cut short
            write_result(result, json_path)
    return result


def summarize(runs: dict[str, list[dict]], facts: dict, started: float, png: Path) -> dict:
    """The contract keys over the seeds every mode has finished; draws the PNG."""
    modes, seeds = facts["modes"], min(len(rs) for rs in runs.values())
    runs = {m: rs[:seeds] for m, rs in runs.items()}
    first_seed = runs[modes[0]][0]["seed"]
    t = {m: median_time([r["time_to_target_s"] for r in rs]) for m, rs in runs.items()}
    its = {m: median_time([r["iterations_to_target"] for r in rs]) for m, rs in runs.items()}
    spot_runs = runs.get("spotlight", [])
    taus = np.asarray([x for r in spot_runs for x in r["kendall_tau"]], dtype=float)
    taus = taus[np.isfinite(taus)]
    overruns = [x for r in spot_runs for x in r["budget_overrun"]]
    plot_convergence(runs, facts["target_val_reward"], png,
                     f"bench convergence: {facts['task']}, {seeds} seed{'s' if seeds > 1 else ''}")

    def seed_time(mode: str, i: int) -> float | None:
        return runs[mode][i]["time_to_target_s"] if mode in runs else None

    per_seed = [{"seed": first_seed + i,
                 **{f"time_to_target_s_{m}": seed_time(m, i) for m in modes},
                 "speedup_vs_vanilla": _speedup(seed_time("vanilla", i), seed_time("spotlight", i)),
                 "speedup_vs_sync": _speedup(seed_time("sync", i), seed_time("spotlight", i))}
                for i in range(seeds)]
    return {
        "bench": "convergence", **facts, "seeds": seeds,
        "time_to_target_s": t,
        "iterations_to_target": {m: (int(v) if v is not None and float(v).is_integer() else v)
                                 for m, v in its.items()},
        "speedup_vs_vanilla": _speedup(t.get("vanilla"), t.get("spotlight")),
        "speedup_vs_sync": _speedup(t.get("sync"), t.get("spotlight")),
        "per_seed": per_seed,
        "kendall_tau": {"median": float(np.median(taus)) if len(taus) else None,
                        "p10": float(np.percentile(taus, 10)) if len(taus) else None,
                        "iterations": len(taus), "over": "selected seeds (biased upwards)"},
        "audit_tau": _summary([x for r in spot_runs for x in r.get("audit_tau", [])]),
        "group_reward_std": {m: float(np.mean([r["group_reward_std"] for r in rs]))
                             for m, rs in runs.items()},
        "budget_overrun_fraction": float(np.mean(overruns)) if overruns else None,
        "val_curves": {m: rs[0]["val_curve"] for m, rs in runs.items()},
        "val_curves_by_seed": {m: {str(r["seed"]): r["val_curve"] for r in rs}
                               for m, rs in runs.items()},
        "fallback_iterations": {str(r["seed"]): r["fallback_iterations"]
                                for r in spot_runs},
        "wall_s": time.monotonic() - started, "machine": machine(),
    }
