"""``make demo``: pretrain (cached), a few Flow-GRPO iterations in one process, and a report."""
from __future__ import annotations

import json
from pathlib import Path

from pipelines.inprocess import InProcessRun
from pipelines.report import image_grid, reward_curve
from spotlight.config import RunConfig


def _labels(result) -> list[str]:
    seeds = result.rewards.shape[1]
    return [(p.target or p.text) for p in result.prompts for _ in range(seeds)]


def run_demo(config: RunConfig, iterations: int | None = None, report_dir: Path = Path("reports/demo")) -> dict:
    iterations = config.iterations if iterations is None else iterations
    print(f"spotlight demo: task={config.world.task} config={config.source} iterations={iterations}")
    run = InProcessRun(config)
    print(f"recogniser held-out accuracy: {run.reward_fn.recognizer_accuracy:.3f}")
    before = run.validate(0)
    print(f"validation reward before RL: {before.mean_reward:.3f}")
    image_grid(before.images[:32], _labels(before)[:32], report_dir / "validation_before.png",
               rewards=before.rewards.reshape(-1)[:32])

    def line(stats, val):
        extra = f"  val {val:.3f}" if val is not None else ""
        print(f"iter {stats.iteration + 1:3d}/{iterations}  reward {stats.reward_mean:.3f}  "
              f"group std {stats.group_reward_std:.3f}  zero-std groups {stats.zero_std_groups}/"
              f"{stats.groups}  {sum(stats.seconds.values()):.1f}s{extra}", flush=True)

    history = run.run(iterations, on_iteration=line)
    after = run.last_validation  # run() always ends with a validation of the final weights
    image_grid(after.images[:32], _labels(after)[:32], report_dir / "validation_after.png",
               rewards=after.rewards.reshape(-1)[:32])
    reward_curve({config.world.task: history.val_curve}, report_dir / "reward_curve.png")
    summary = {"task": config.world.task, "iterations": iterations,
               "val_reward_before": before.mean_reward, "val_reward_after": after.mean_reward,
               "val_curve": history.val_curve}
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"validation reward after RL:  {after.mean_reward:.3f}  "
          f"(change {after.mean_reward - before.mean_reward:+.3f})")
    print(f"report: {report_dir}/ (validation_before.png, validation_after.png, reward_curve.png)")
    return summary

