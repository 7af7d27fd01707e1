"""The pictures of ``bench simulate``: each sweep's speedup and cost ratio against on-demand per
system, and one simulated iteration per system as lanes of GPU groups over time."""
from __future__ import annotations

from pathlib import Path

COLORS = {"ondemand": "C7", "sync": "C1", "offpolicy": "C4", "rlboost": "C2", "spotlight": "C3"}
STAGE_COLORS = {"rollout": "C0", "explore": "C3", "train": "C7"}


def sweep_points(sweep: dict) -> tuple[list[str], list[dict]]:
    """(x labels, ratio dicts) of a sweep saved either as ``{"points": [...]}`` or by label."""
    if "points" in sweep:
        return [str(p["value"]) for p in sweep["points"]], sweep["points"]
    return list(sweep), list(sweep.values())


def plot_sweeps(sweeps: dict[str, dict], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(sweeps)
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 6.0), squeeze=False)
    for col, name in enumerate(names):
        labels, points = sweep_points(sweeps[name])
        for row, key, title in ((0, "speedup_vs_ondemand", "time to target: x faster"),
                                (1, "cost_ratio_vs_ondemand", "cost to target: x cheaper")):
            ax = axes[row][col]
            systems = sorted({s for p in points for s in p[key]})
            for system in systems:
                ys = [p[key].get(system) for p in points]
                ax.plot(labels, [y if y is not None else float("nan") for y in ys], marker="o",
                        color=COLORS.get(system), label=system)
            ax.axhline(1.0, color="k", lw=0.5)
            ax.set_title(f"{name}\n{title}" if row == 0 else title, fontsize=9)
            ax.tick_params(labelsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Simulated systems against on-demand Flow-GRPO (1.0 = the same)", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timelines(timelines: dict[str, list], path: str) -> str:
    """One panel per system: each GPU group's lane, its rollout, exploration and training."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = {k: v for k, v in timelines.items() if v}
    fig, axes = plt.subplots(len(shown) or 1, 1, figsize=(10, 1.6 + 1.3 * len(shown)),
                             squeeze=False)
    for ax, (system, spans) in zip(axes[:, 0], shown.items()):
        lanes = sorted({s[0] for s in spans}, key=lambda n: (not n.startswith("od"), n))
        t0 = min(s[1] for s in spans)
        for lane_index, lane in enumerate(lanes):
            for _, start, end, what in (s for s in spans if s[0] == lane):
                stage, _, outcome = what.partition(":")
                ax.barh(lane_index, end - start, left=start - t0, height=0.8,
                        color=STAGE_COLORS.get(stage, "C9"),
                        alpha=0.35 if outcome in ("lost", "cancelled", "handed back") else 0.9)
        ax.set_yticks(range(len(lanes)), lanes, fontsize=6)
        ax.set_title(f"{system}: one iteration (blue rollout, red exploration, grey training)",
                     fontsize=9)
        ax.set_xlabel("seconds since the iteration started", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
