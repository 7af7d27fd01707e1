"""The picture of ``bench convergence``: validation curves (median and 10-90% band over seeds per
mode) beside the paired ratios with their 90% intervals."""
from __future__ import annotations

from pathlib import Path

import numpy as np

RATIOS = (("speedup_vs_vanilla", "time: vanilla / spotlight"),
          ("speedup_vs_sync", "time: sync / spotlight"),
          ("iteration_speedup_vs_vanilla", "iterations: vanilla / spotlight"),
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


def plot_convergence(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    choices = {m: c for m, c in result.get("planner_choices", {}).items() if c}
    fig, axes = plt.subplots(1, 3 if choices else 2, figsize=(17 if choices else 12, 4.2))
    left, right = axes[0], axes[1]
    if choices:
        plot_planner_choices(axes[2], choices)
    for i, (mode, curves) in enumerate(result["val_curves"].items()):
        xs, mid, lo, hi = curve_band(curves)
        left.plot(xs, mid, marker="o", ms=3, color=f"C{i}", label=f"{mode} (median)")
        left.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.15)
    left.axhline(result["target"], color="grey", ls="--", lw=1, label="target")
    left.set(xlabel="iterations trained", ylabel="validation reward",
             title=f"validation reward, {result['seeds']} paired seeds (band: 10-90%)")
    left.legend(fontsize=8)
    shown = [(label, result[key]) for key, label in RATIOS
             if result.get(key) and result[key]["median"] is not None]
    for y, (label, ratio) in enumerate(shown):
        lo, hi = ratio["ci90"]
        right.errorbar([ratio["median"]], [y], xerr=[[ratio["median"] - lo], [hi - ratio["median"]]],
                       fmt="o", color="C0", capsize=4)
        right.scatter(ratio["per_seed"], [y] * len(ratio["per_seed"]), s=10, color="grey",
                      alpha=0.6, zorder=0)
    right.axvline(1.0, color="grey", lw=1)
    right.set_yticks(range(len(shown)), [label for label, _ in shown])
    right.set(xlabel="paired ratio (median, 90% bootstrap interval; dots: seeds)",
              title="speed-ups and staleness cost")
    right.set_xscale("log")
    fig.suptitle(f"bench convergence: {result['task']}, to the target {result['target']:.3f} "
                 f"(at most {result['iterations']} iterations)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
