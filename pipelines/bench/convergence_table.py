"""A ``bench convergence`` result as the table a person reads first: one row per mode, with
iterations beside time to the target (so it shows whether a mode buys learning or only time),
its wait for exploration, and its speed-ups against the strongest baseline and vanilla; under it,
where the measured modes' gpu path goes, stage by stage.

Pure formatting over the result's keys; the bench prints it when it ends, and
``python -m pipelines.bench.convergence_table RESULT.json`` prints it from a saved result.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("mode", "iterations to target", "unreached", "s / iteration", "explore wait s",
           "time to target s", "vs the best baseline", "vs vanilla")


def interval(figure: dict | None, digits: int) -> str:
    """``{median, ci90}`` as "median [low, high]" ("-" where there is none)."""
    if not figure or figure.get("median") is None:
        return "-"
    low, high = figure["ci90"]
    return f"{figure['median']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mode_rows(result: dict) -> list[list[str]]:
    """One row of :data:`COLUMNS` per mode, in the bench's order; the best baseline's own
    speed-up against itself is "-" (it is the yardstick). A mode the result has no figure for
    (not timed, or vanilla against itself) gets "-" in that column."""
    rows = []
    for mode in result["modes"]:
        to_target = result["to_target"].get(mode, {})
        speedups = result["speedup_by_mode"].get(mode, {})
        rows.append([
            mode + (" (product)" if mode == result.get("product") else "")
            + (" (best baseline)" if mode == result.get("best_baseline") else ""),
            interval(to_target.get("iterations"), 1),
            f"{result['unreached'][mode]} of {result['seeds']}",
            number(result["seconds_per_iteration"].get(mode), 1),
            number(result["explore_wait_s"].get(mode), 1),
            interval(to_target.get("time_s"), 0),
            interval(speedups.get("vs_best_baseline"), 2),
            interval(speedups.get("vs_vanilla"), 2)])
    return rows


# The stages shown one by one in the gpu-path table; the rest are summed as "other".
SHOWN_STAGES = ("rollout", "reward", "train")


def stage_table(result: dict) -> list[str]:
    """The measured modes' gpu path as a Markdown table: median seconds an iteration spends in
    each stage (their cluster runs, the iterations that time them); no lines without any."""
    by_mode = result.get("stage_s") or {}
    if not by_mode:
        return []
    lines = ["| gpu path, seconds an iteration | " + " | ".join(SHOWN_STAGES)
             + " | other | all |", "|" + "---|" * (len(SHOWN_STAGES) + 3)]
    for mode, stages in by_mode.items():
        shown = [stages.get(stage, 0.0) for stage in SHOWN_STAGES]
        other = sum(s for stage, s in stages.items() if stage not in SHOWN_STAGES)
        lines.append("| " + " | ".join([mode] + [number(s, 1) for s in
                                                   (*shown, other, sum(shown) + other)]) + " |")
    return lines


def markdown_table(result: dict) -> str:
    """The result's headline as a Markdown table, under a line naming the seeds, the base's
    validation (with its standard error) and the target; empty before any seed finished."""
    if not result.get("seeds"):
        return ""
    head = (f"{result['task']}: {result['seeds']} of {result['seeds_asked']} paired seeds; "
            f"base validation {result['base_val_reward']:.4f} (standard error "
            f"{result['base_val_standard_error']:.4f}), target {result['target']:.4f}; "
            "medians with 90% bootstrap intervals")
    lines = [head, "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in mode_rows(result)]
    stages = stage_table(result)
    return "\n".join(lines + ([""] + stages if stages else []))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pipelines.bench.convergence_table RESULT.json", file=sys.stderr)
        return 2
    print(markdown_table(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
