"""``make demo``: the digits OCR task on an embedded Dask cluster in spotlight mode, and a report.

Pretraining is cached; the run starts a scheduler, one on-demand (gpu) and one spot worker,
runs a few iterations with stale-weight exploration on the spot worker, and writes a report
folder: validation grids before and after, the reward curve, and a per-worker timeline that
shows exploration overlapping training.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipelines.front.console import ConsoleProgress, dashboard_line, dask_log_line
from pipelines.front.html_report import write_report
from pipelines.front.report import image_grid, reward_curve
from pipelines.front.session import Session
from pipelines.front.timeline import CRITICAL_STAGES, overlap_fraction, plot_timeline
from pipelines.observe.validation_grid import validation_labels
from spotlight.config import RunConfig
from spotlight.evidence import paired_gain


def _grid(validation: dict, prompts, path: Path) -> None:
    rewards = validation["rewards"]
    labels = validation_labels(prompts, rewards)
    image_grid(validation["images"][:32].astype(np.float32), labels[:32], path,
               rewards=rewards.reshape(-1)[:32])


def validation_gain(before: dict, after: dict) -> dict:
    """The gain of the validation reward from the first validation to the last, with a
    bootstrap interval over the same prompts and seeds (spotlight.evidence.paired_gain)."""
    first = np.asarray(before["rewards"], dtype=float).reshape(-1)
    last = np.asarray(after["rewards"], dtype=float).reshape(-1)
    return {**paired_gain(first, last), "pairs": int(first.size)}


def run_demo(config: RunConfig, iterations: int | None = None,
             report_dir: Path = Path("reports/demo"), store: str | None = None) -> dict:
    iterations = config.iterations if iterations is None else iterations
    config = config.with_values({"iterations": iterations})
    print(f"spotlight demo: task={config.world.task} mode={config.mode} config={config.source} "
          f"iterations={iterations}")
    with Session.from_config(config, store=store, on_event=ConsoleProgress(),
                             progress=True) as session:
        print(f"run store: {session.url}")
        if dask_log_line(session):
            print(dask_log_line(session))
        print(dashboard_line(session), flush=True)
        session.run(iterations)
        driver, results = session.driver, session.results
        before, after = driver.first_validation, driver.last_validation
        curve = session.val_curve()
        tasks = session.task_records()
        val_prompts = session.val_prompts
        url = session.url
    report_dir.mkdir(parents=True, exist_ok=True)
    _grid(before, val_prompts, report_dir / "validation_before.png")
    _grid(after, val_prompts, report_dir / "validation_after.png")
    reward_curve({config.world.task: curve}, report_dir / "reward_curve.png")
    plot_timeline(tasks, report_dir / "timeline.png",
                  title=f"{config.world.task}, {config.mode} mode: tasks per worker")
    overlap = overlap_fraction(tasks, inner="explore", outer=CRITICAL_STAGES) \
        if any(t["stage"] == "explore" for t in tasks) else None
    summary = {
        "task": config.world.task, "mode": config.mode, "iterations": iterations, "run": url,
        "val_reward_before": before["mean_reward"], "val_reward_after": after["mean_reward"],
        "val_gain": validation_gain(before, after),
        "val_curve": curve, "explored": sum(r.explored for r in results),
        "planned": sum(r.planned for r in results), "exploration_overlap": overlap,
        "wall_s": results[-1].end - results[0].start if results else 0.0,
        "cost_usd": results[-1].cost_total_usd if results else 0.0}
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(url, report_dir / "report.html")   # the whole run in one page, from its store
    gain = summary["val_gain"]
    lo, hi = gain["ci90"]
    print(f"validation reward before RL: {before['mean_reward']:.3f}")
    print(f"validation reward after RL:  {after['mean_reward']:.3f}  (gain {gain['gain']:+.3f}, "
          f"90% interval [{lo:+.3f}, {hi:+.3f}] over {gain['pairs']} prompt-seed pairs)")
    if overlap is not None:
        print(f"exploration: {summary['explored']}/{summary['planned']} candidates scored, "
              f"{overlap:.0%} of it while the gpu worker was busy")
    print(f"cost: ${summary['cost_usd']:.4f} at the configured cloud prices")
    print(f"report: {report_dir}/report.html (the whole run; also validation_before.png, "
          "validation_after.png, reward_curve.png, timeline.png, summary.json)")
    print(f"audit: spotlight audit {url}")
    return summary
