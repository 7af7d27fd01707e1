"""``spotlight bench learning``: does Flow-GRPO (vanilla, in process) measurably learn on the digits
world?

It runs a fixed number of iterations (per task, or ``--iterations``), not a wall budget: the
run is seeded end to end, so its verdict is the same on a fast machine and a slow one; only the
wall time it reports moves.
"""
from __future__ import annotations

import time

from pipelines.bench.registry import machine, register_bench
from pipelines.run.inprocess import InProcessRun
from spotlight.config import load_config, shipped_config
from spotlight.rewards.geneval import strict_scores

TASK_CONFIGS = {"ocr": shipped_config("digits.yaml"),
                "geneval": shipped_config("digits-geneval.yaml")}
# Iterations per task: where the shipped configs' validation reward stood at least 0.10 above
# the base model's in every measured run (docs/results.md).
TASK_ITERATIONS = {"ocr": 90, "geneval": 50}


@register_bench("learning")
def bench_learning(task: str = "ocr", quick: bool = False, config: str | None = None,
                   iterations: int | None = None, progress: bool = True,
                   **_: object) -> dict:
    """Validation reward of the cached base model, then after ``iterations`` of RL."""
    if task not in TASK_CONFIGS and config is None:
        raise ValueError(f"--task {task!r} is not known; choose one of {sorted(TASK_CONFIGS)}")
    # The base model too is trained for exactly pretrain.steps: under its default wall-clock
    # cap a slower (or busier) machine would start RL from a weaker model.
    overrides: dict = {"pretrain.time_budget_s": 86400.0}
    if quick:
        overrides.update({"grpo.prompts_per_iteration": 2, "grpo.group_size": 4,
                          "validation.max_prompts": 8, "validation.every": 1})
    cfg = load_config(config or TASK_CONFIGS[task], overrides)
    started = time.monotonic()
    run = InProcessRun(cfg, "vanilla", progress=progress)
    setup_s = time.monotonic() - started
    walls = {0: 0.0}

    def report(it):
        walls[it.iteration + 1] = time.monotonic() - started - setup_s
        if progress:
            extra = f" val={it.val_reward:.3f}" if it.val_reward is not None else ""
            print(f"iter {it.iteration:3d} reward={it.rollout_reward:.3f} "
                  f"group_std={it.group_std:.3f} dropped={it.zero_std_groups}"
                  f" {it.wall_s:.1f}s{extra}", flush=True)

    iterations = iterations or (3 if quick else TASK_ITERATIONS.get(task, 50))
    try:
        history = run.run_iterations(iterations, report=report)
        validation, reward_fn = run.last_validation, run.reward_fn
    finally:
        run.close()
    its = history.iterations
    curve = [{"iteration": k, "wall_s": walls[k], "val_reward": v}
             for k, v in history.val_curve()]
    groups = len(its) * cfg.grpo.prompts_per_iteration or 1
    return {
        "bench": "learning",
        "task": cfg.world.task,
        "config": cfg.source,
        "base_val_reward": curve[0]["val_reward"],
        "final_val_reward": curve[-1]["val_reward"],
        "improvement": curve[-1]["val_reward"] - curve[0]["val_reward"],
        "val_curve": curve,
        "iterations": len(its),
        "wall_s": curve[-1]["wall_s"],
        "setup_s": setup_s,
        "iterations_asked": iterations,
        "recognizer_accuracy": reward_fn.recognizer_accuracy,
        "zero_std_group_fraction": sum(it.zero_std_groups for it in its) / groups,
        "group_reward_std_mean": sum(it.group_std for it in its) / max(len(its), 1),
        "train_reward_curve": [it.rollout_reward for it in its],
        **(strict_scores(validation["rewards"], validation["prompts"])
           if cfg.world.task == "geneval" else {}),
        "machine": machine(),
    }
