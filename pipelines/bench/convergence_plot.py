"""The picture of ``bench convergence``: validation curves (median and 10-90% band over seeds per
mode), iterations to target per seed, and the paired ratios with their 90% intervals."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.bench.bench_modes import baseline_of, planned_ratio, split_mode

RATIOS = (("speedup_vs_vanilla", "time: vanilla / {product}"),
          ("speedup_vs_sync", "time: sync / {product}"),
          ("iteration_speedup_vs_vanilla", "iterations: vanilla / {product}"),
          ("staleness_cost", "iterations: stale / fresh"))


def curve_band(curves: list[list[tuple[int, float]]]) -> tuple[list, list, list, list]:
    """Iterations validated in every curve, and the median, 10th and 90th percentile there."""
    common = sorted(set.intersection(*[{i for i, _ in c} for c in curves]))
    values = np.asarray([[dict(c)[i] for i in common] for c in curves], dtype=float)
    lo, mid, hi = np.percentile(values, [10, 50, 90], axis=0)
    return common, list(mid), list(lo), list(hi)


def plot_planner_choices(ax, choices: dict[str, list[list[int]]]) -> None:
    """The planner's N (candidates, solid) and M (replay steps, dashed) per iteration explored,
    first seed, per planned mode."""
    twin = ax.twinx()
    for i, (mode, rows) in enumerate(choices.items()):
        its = [r[0] for r in rows]
        ax.step(its, [r[1] for r in rows], where="mid", color=f"C{i + 3}", label=f"{mode}: N")
        twin.step(its, [r[2] for r in rows], where="mid", color=f"C{i + 3}", ls="--", alpha=0.6)
    ax.set(xlabel="iteration explored", ylabel="N candidates per prompt (solid)",
           title="the planner's choices (first seed)")
    twin.set_ylabel("M replay steps (dashed)")
    ax.legend(fontsize=8)


def plot_curves(ax, result: dict) -> None:
    """Median and 10-90% band per mode up to the budget, where every seed has run; each seed's
    own curve, thin, as far as it ran (runs stop once past the budget and at the target)."""
    budget = result.get("budget") or result["iterations"]
    for i, (mode, curves) in enumerate(result["val_curves"].items()):
        for curve in curves:
            ax.plot(*zip(*curve), color=f"C{i}", lw=0.6, alpha=0.35)
        xs, mid, lo, hi = curve_band([[p for p in c if p[0] <= budget] for c in curves])
        ax.plot(xs, mid, marker="o", ms=3, color=f"C{i}", label=f"{mode} (median)")
        ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.15)
    ax.axhline(result["target"], color="grey", ls="--", lw=1, label="target")
    ax.axvline(budget, color="grey", ls=":", lw=1)
    ax.set(xlabel="iterations trained", ylabel="validation reward",
           title=f"validation, {result['seeds']} paired seeds (band 10-90% to the budget)")
    ax.legend(fontsize=8)


def plot_iterations(ax, result: dict) -> None:
    """Iterations to the target per seed and mode (x: never reached within the cap)."""
    never = result["iterations"] + result["validation_every"]
    for i, (mode, its) in enumerate(result["iterations_to_target"].items()):
        jitter = np.linspace(-0.15, 0.15, len(its)) if len(its) > 1 else [0.0]
        reached = [(i + j, x) for j, x in zip(jitter, its) if x is not None]
        if reached:
            ax.scatter(*zip(*reached), color=f"C{i}", s=18)
            ax.hlines(np.median([x if x is not None else never for x in its]), i - 0.3, i + 0.3,
                      color=f"C{i}", lw=2)
        missed = [i + j for j, x in zip(jitter, its) if x is None]
        ax.scatter(missed, [never] * len(missed), color=f"C{i}", marker="x", s=24)
    modes = list(result["iterations_to_target"])
    slanted = len(modes) > 3   # more names than fit side by side
    ax.set_xticks(range(len(modes)), modes, rotation=30 if slanted else 0,
                  ha="right" if slanted else "center")
    ax.set(ylabel="iterations to target", ylim=(0, never + 2),
           title="per seed (bar: median; x: never, at the cap)")


def shown_ratios(result: dict) -> list[tuple[str, dict]]:
    """The headline ratios of the product, then every other mode's speed-up over vanilla in
    time (stale at the fixed arm, the planner at other spot capacities, other objectives), and
    what exploration adds to each objective other than vanilla Flow-GRPO's."""
    product = result.get("product", "spotlight")
    shown = [(label.format(product=product), result[key]) for key, label in RATIOS
             if result.get(key)]
    for mode, ratios in result.get("speedup_by_mode", {}).items():
        if mode not in (product, "sync") and ratios.get("vs_vanilla"):
            shown.append((f"time: vanilla / {mode}", ratios["vs_vanilla"]))
    for mode, ratios in result.get("speedup_by_mode", {}).items():
        if ratios.get("vs_objective_alone") and baseline_of(mode) != "vanilla":
            shown.append((f"time: {baseline_of(mode)} / {mode}", ratios["vs_objective_alone"]))
    return [(label, ratio) for label, ratio in shown if ratio["median"] is not None]


def budget_curves(result: dict) -> dict[str, list[tuple[int, dict]]]:
    """Per objective with planned modes at two or more spot capacities: (capacity R, the
    planned mode's speed-up over that objective without exploration), R ascending."""
    out: dict[str, list[tuple[int, dict]]] = {}
    for mode, ratios in result.get("speedup_by_mode", {}).items():
        ratio, alone = planned_ratio(mode), ratios.get("vs_objective_alone")
        if ratio and alone and alone["median"] is not None:
            out.setdefault(split_mode(mode)[0] or "flow-grpo", []).append((ratio, alone))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items() if len(v) > 1}


def plot_budget(ax, curves: dict[str, list[tuple[int, dict]]]) -> None:
    """Speed-up against exploration budget (spot capacity per gpu worker), per objective."""
    for i, (objective, points) in enumerate(curves.items()):
        xs = [r for r, _ in points]
        mid = [p["median"] for _, p in points]
        lo = [m - p["ci90"][0] for m, (_, p) in zip(mid, points)]
        hi = [p["ci90"][1] - m for m, (_, p) in zip(mid, points)]
        ax.errorbar(xs, mid, yerr=[lo, hi], marker="o", capsize=4, color=f"C{i}",
                    label=objective)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set(xlabel="spot capacity per gpu worker (exploration budget)",
           ylabel="time: objective alone / with exploration",
           title="speed-up against exploration budget")
    ax.legend(fontsize=8)


def plot_ratios(ax, result: dict) -> None:
    shown = shown_ratios(result)
    for y, (label, ratio) in enumerate(shown):
        lo, hi = ratio["ci90"]
        ax.errorbar([ratio["median"]], [y], xerr=[[ratio["median"] - lo], [hi - ratio["median"]]],
                    fmt="o", color="C0", capsize=4)
        ax.scatter(ratio["per_seed"], [y] * len(ratio["per_seed"]), s=10, color="grey",
                   alpha=0.6, zorder=0)
    ax.axvline(1.0, color="grey", lw=1)
    ax.set_yticks(range(len(shown)), [label for label, _ in shown])
    ax.set(xlabel="paired ratio (median, 90% bootstrap interval; dots: seeds)",
           title="speed-ups and staleness cost")
    ax.set_xscale("log")
    ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16) if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def plot_convergence(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    choices = {m: c for m, c in result.get("planner_choices", {}).items() if c}
    budgets = budget_curves(result)
    extra = [bool(choices), bool(budgets)]
    panels = 3 + sum(extra)
    fig, axes = plt.subplots(1, panels, figsize=(5.6 * panels, 4.4),
                             gridspec_kw={"width_ratios": [3, 2, 3] + [3] * sum(extra)})
    plot_curves(axes[0], result)
    plot_iterations(axes[1], result)
    plot_ratios(axes[2], result)
    if choices:
        plot_planner_choices(axes[3], choices)
    if budgets:
        plot_budget(axes[-1], budgets)
    fig.suptitle(f"bench convergence: {result['task']}, to the target {result['target']:.3f} "
                 f"(at most {result['iterations']} iterations)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
