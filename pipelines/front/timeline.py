"""Where time went: a per-worker timeline of a run's tasks; how much exploration hid in training.

A task is a dict with ``worker``, ``stage``, ``start``, ``end`` (seconds) and ``iteration``, as
the workers' task records carry them. A worker's class is its ``worker_class`` key when present,
else read from its name (``spot-*`` is spot, anything else an on-demand gpu worker).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from spotlight.cost import interval_overlap

STAGE_COLOURS = {
    "rollout": "tab:blue", "reward": "tab:orange", "advantages": "tab:olive", "train": "tab:red",
    "checkpoint": "tab:brown", "validation": "tab:purple", "explore": "tab:green",
    "explore-sync": "tab:cyan",
}
_SPARE_COLOURS = ("tab:pink", "tab:gray", "gold", "navy", "teal", "salmon")
_KEYS = ("worker", "stage", "start", "end", "iteration")


def _check(tasks: Sequence[dict]) -> None:
    for i, task in enumerate(tasks):
        missing = [k for k in _KEYS if k not in task]
        if missing:
            raise ValueError(f"task {i} lacks {missing}; a task needs keys {list(_KEYS)}: {task!r}")
        if task["end"] < task["start"]:
            raise ValueError(f"task {i} ({task['stage']} on {task['worker']}) ends at "
                             f"{task['end']}, before it starts at {task['start']}")


def worker_class(task: dict) -> str:
    """'spot' or 'gpu': the task's ``worker_class``, else inferred from the worker's name."""
    return task.get("worker_class") or ("spot" if str(task["worker"]).startswith("spot") else "gpu")


def _lane_key(worker: str, cls: str) -> tuple:
    # gpu lanes above spot lanes; "gpu-10" after "gpu-2"
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", worker)]
    return (cls != "gpu", [(isinstance(p, str), p) for p in parts])


def merge_intervals(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of closed intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


# The gpu stages an iteration waits for: exploration that runs inside them costs no wall time.
CRITICAL_STAGES = ("rollout", "reward", "advantages", "train", "checkpoint")


def overlap_fraction(tasks: Sequence[dict], inner: str = "explore",
                     outer: str | Sequence[str] = "train") -> float:
    """Share of all ``inner``-stage task time inside the union of ``outer``-stage task intervals
    (``outer``: one stage or several).

    0.0 when there is no ``inner`` time. With ``outer=CRITICAL_STAGES``: how much of the spot
    workers' exploration ran while the gpu workers worked on the iteration, rather than adding
    to its time.
    """
    _check(tasks)
    outer = {outer} if isinstance(outer, str) else set(outer)
    union = merge_intervals([(t["start"], t["end"]) for t in tasks if t["stage"] in outer])
    inside = total = 0.0
    for t in tasks:
        if t["stage"] != inner:
            continue
        total += t["end"] - t["start"]
        inside += sum(interval_overlap(t["start"], t["end"], a, b) for a, b in union)
    return inside / total if total > 0 else 0.0


def _spans(tasks: Sequence[dict], stages: Sequence[str]) -> dict[int, tuple[float, float]]:
    """Per iteration: (first start, last end) of its tasks of ``stages``."""
    spans: dict[int, tuple[float, float]] = {}
    for t in tasks:
        if t["stage"] in stages:
            a, b = spans.get(t["iteration"], (t["start"], t["end"]))
            spans[t["iteration"]] = (min(a, t["start"]), max(b, t["end"]))
    return dict(sorted(spans.items()))


def stage_spans(tasks: Sequence[dict], stage: str) -> dict[int, float]:
    """Per iteration: seconds from the first ``stage`` task's start to the last one's end (a
    rollout pulled by several workers is one span)."""
    _check(tasks)
    return {k: b - a for k, (a, b) in _spans(tasks, (stage,)).items()}


def idle_time(tasks: Sequence[dict], cls: str = "spot",
              window: Sequence[str] = ("train", "checkpoint")) -> tuple[float, float]:
    """(idle, total) worker-seconds of class ``cls`` during one run's training time: per
    iteration, from its first ``window`` task's start to its last one's end, for each worker of
    ``cls`` with a task in ``tasks``; idle = running no task at all."""
    _check(tasks)
    windows = list(_spans(tasks, window).values())
    workers = sorted({t["worker"] for t in tasks if worker_class(t) == cls})
    total = sum(b - a for a, b in windows) * len(workers)
    busy = 0.0
    for worker in workers:
        union = merge_intervals([(t["start"], t["end"]) for t in tasks if t["worker"] == worker])
        busy += sum(interval_overlap(a, b, c, d) for a, b in windows for c, d in union)
    return total - busy, total


def idle_share(runs: Sequence[Sequence[dict]], cls: str = "spot") -> float | None:
    """Share of the training time that the workers of class ``cls`` sit idle, over ``runs``
    (each one run's tasks; iterations are numbered per run): the paper's motivating
    measurement, spot GPUs idle while on-demand GPUs train. None without such a worker."""
    idle, total = (sum(x) for x in zip(*[idle_time(tasks, cls) for tasks in runs] or [(0, 0)]))
    return idle / total if total > 0 else None


def plot_timeline(tasks: Sequence[dict], path: str | Path, *, title: str | None = None,
                  marks: Sequence[dict] = ()) -> Path:
    """Save a PNG with one lane per worker and a bar per task, coloured by stage.

    Grey bands behind the bars span each iteration's train tasks, so exploration on the spot
    lanes can be seen overlapping training. ``marks`` ({"worker", "at", "mark"}: a worker
    killed, told to go or lost at time ``at``) are drawn on their workers' lanes.
    """
    _check(tasks)
    if not tasks:
        raise ValueError("no tasks to plot; pass the task records of at least one iteration")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = min(t["start"] for t in tasks)
    classes = {m["worker"]: worker_class(m) for m in marks} | \
        {t["worker"]: worker_class(t) for t in tasks}   # a worker lost before any task: a lane
    lanes = sorted(classes, key=lambda w: _lane_key(str(w), classes[w]))
    row = {w: i for i, w in enumerate(lanes)}
    stages = list(dict.fromkeys(t["stage"] for t in tasks))
    spare = iter(_SPARE_COLOURS * (1 + len(stages) // len(_SPARE_COLOURS)))
    colour = {s: STAGE_COLOURS.get(s) or next(spare) for s in stages}

    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(lanes)))
    train: dict[int, list[float]] = {}
    for t in tasks:
        if t["stage"] == "train":
            span = train.setdefault(t["iteration"], [t["start"], t["end"]])
            span[0], span[1] = min(span[0], t["start"]), max(span[1], t["end"])
    for k, (a, b) in sorted(train.items()):
        ax.axvspan(a - t0, b - t0, color="0.88", zorder=0)
        ax.text((a + b) / 2 - t0, 0.99, f"train {k}", transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7, color="0.35")
    for t in tasks:
        ax.barh(row[t["worker"]], t["end"] - t["start"], left=t["start"] - t0, height=0.6,
                color=colour[t["stage"]], edgecolor="black", linewidth=0.3, zorder=2)
    ax.set_yticks(range(len(lanes)), [f"{w} ({classes[w]})" for w in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.95)   # first lane on top, room above it for band labels
    ax.set_xlabel("seconds since the first task started")
    ax.set_title(title or "task timeline")
    ax.grid(axis="x", alpha=0.3, zorder=1)
    handles = [Patch(color=colour[s], label=s) for s in stages]
    handles.append(Patch(color="0.88", label="train span"))
    handles += _draw_marks(ax, marks, row, t0)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


MARK_STYLES = {"kill": ("X", "red"), "lost": ("x", "black"), "notice": ("v", "darkorange"),
               "hand-back": ("<", "purple"), "silent": ("d", "gray")}


def _draw_marks(ax, marks: Sequence[dict], row: dict, t0: float) -> list:
    """Markers for ``marks`` on their lanes; the legend handles of the kinds drawn."""
    from matplotlib.lines import Line2D

    handles = []
    for kind in dict.fromkeys(m["mark"] for m in marks):
        symbol, colour = MARK_STYLES.get(kind, ("o", "red"))
        these = [m for m in marks if m["mark"] == kind]
        ax.scatter([m["at"] - t0 for m in these], [row[m["worker"]] for m in these], s=70,
                   marker=symbol, color=colour, zorder=3)
        handles.append(Line2D([], [], marker=symbol, color=colour, linestyle="", label=kind))
    return handles
