"""``spotlight run --dry-run``: size a run from its config before any worker starts.

Per stage and worker class: the device, the memory a worker needs, the seconds the stage takes
per iteration; then the iteration's wall time (exploration hides in the training window), the
GPU-hours per worker class and their cost at the configured prices. How each figure is computed
is printed under the table (see :mod:`spotlight.sizing`).
"""
from __future__ import annotations

from spotlight.config import RunConfig
from spotlight.cost import PriceTable, load_prices, worker_class_instances, worker_class_prices
from spotlight.iteration import explore_window
from spotlight.models.base import model_size
from spotlight.sizing import (
    GPU_MEMORY_GIB,
    INFERENCE_ACTIVATIONS,
    Estimate,
    best_fitting_arm,
    iteration_estimates,
)


def estimates(config: RunConfig, size, gpu_speed: float = 1.0,
              arm: tuple[int, int] | None = None) -> list[Estimate]:
    """The stages' estimates; exploration with ``arm`` = (N, M) if given, else the config's."""
    grpo, sampler, explore = config.grpo, config.sampler, config.exploration
    trained = max(1, round(grpo.timestep_fraction * (sampler.sde_window_size or sampler.num_steps)))
    candidates, steps = arm or (explore.candidates, explore.steps or sampler.num_steps)
    rows = iteration_estimates(
        size, prompts=grpo.prompts_per_iteration, group=grpo.group_size,
        request_prompts=grpo.request_prompts,
        steps=sampler.num_steps, cfg=config.model.true_cfg > 1.0, candidates=candidates,
        explore_steps=steps, explore_batch=explore.request_batch, micro_batch=grpo.micro_batch,
        trained_steps=trained, gpu_workers=config.cluster.gpu_workers,
        spot_workers=config.cluster.spot_workers, gpu_speed=gpu_speed,
        checkpointing=config.model.gradient_checkpointing, reference=grpo.beta_kl > 0)
    return rows


def planned(config: RunConfig, size, by_stage: dict, gpu_speed: float = 1.0
            ) -> tuple[tuple[int, int] | None, str]:
    """The planner's (N, M) arm that fits the training window, as it would choose, and a line
    saying so (None when the planner is off)."""
    planner, sampler = config.planner, config.sampler
    if not planner.enabled:
        return None, "planner off: exploration.candidates every iteration"
    window = by_stage["train"].seconds + (by_stage["rollout"].seconds
                                          if explore_window(config) == "iteration" else 0.0)
    budget = planner.budget_fraction * window
    arms = [(n, m or sampler.num_steps) for n in planner.candidates for m in planner.steps]
    best = best_fitting_arm(size, arms, budget, prompts=config.grpo.prompts_per_iteration,
                            batch=config.exploration.request_batch,
                            cfg=config.model.true_cfg > 1.0,
                            spot_workers=config.cluster.spot_workers, gpu_speed=gpu_speed)
    if best is None:
        return min(arms), (f"planner: no (N, M) arm fits the {budget:.0f} s exploration budget "
                           f"({planner.budget_fraction:g} x the {window:.0f} s window); shown "
                           "with its smallest arm -- add spot workers or cheaper arms")
    n, m, seconds = best
    return (n, m), (f"planner: explores N={n} candidates x M={m} steps, the largest arm that "
                    f"fits: {seconds:.0f} s of the {budget:.0f} s budget "
                    f"({planner.budget_fraction:g} x the {window:.0f} s window)")


def node_lines(config: RunConfig, table: PriceTable, workers: dict[str, int]) -> list[str]:
    """How to start each worker class's nodes: one worker process per GPU of its instance."""
    lines = []
    for cls, (instance, _) in worker_class_instances(config.cost).items():
        count = workers[cls]
        if not count:
            continue
        gpus = table.instance(config.cost.provider, instance).gpus
        nodes = -(-count // gpus)
        lines.append(f"start {cls}: {nodes} x {instance} ({gpus} GPUs each), on each "
                     f"`dask worker ADDR --resources \"{cls}=1\" --nworkers {min(gpus, count)} "
                     f"--nthreads 1`: a worker per GPU, each on a device of its own")
    return lines


def dry_run_report(config: RunConfig, gpu_speed: float = 1.0) -> str:
    size = model_size(config)   # builds the components on the meta device: once
    rows = estimates(config, size, gpu_speed)
    arm, plan_line = planned(config, size, {r.stage: r for r in rows}, gpu_speed)
    if arm is not None:
        rows = estimates(config, size, gpu_speed, arm)
    by_stage = {r.stage: r for r in rows}
    gpu_s = by_stage["rollout"].seconds + by_stage["train"].seconds
    # Spot workers explore while the gpu workers roll out and train; the iteration waits for
    # exploration only where it runs past that window.
    wall = max(gpu_s, by_stage["explore"].seconds)
    table = load_prices(config.cost.prices)
    prices = worker_class_prices(config.cost, table)
    workers = {"gpu": config.cluster.gpu_workers, "spot": config.cluster.spot_workers}
    hours = {cls: workers[cls] * wall / 3600 for cls in workers}
    cost = {cls: hours[cls] * prices[cls] for cls in workers}
    lines = [f"model: {config.model.policy}  transformer {size.transformer / 1e9:.2f} B params, "
             f"VAE {size.vae / 1e6:.0f} M, text encoder {size.text_encoder / 1e9:.2f} B "
             f"(not on workers' critical path: embeddings once per prompt), trainable "
             f"{size.trainable / 1e6:.1f} M; {size.weight_bytes} bytes per weight; "
             f"{size.image_tokens} image tokens per image",
             "",
             f"{'stage':<9}{'workers':<14}{'memory/worker':>15}{'s/iteration':>13}",
             "-" * 51]
    for r in rows:
        device = f"{workers[r.worker_class]} x {r.worker_class}"
        over = "  > an 80 GiB H100" if r.memory_gib > GPU_MEMORY_GIB else ""
        lines.append(f"{r.stage:<9}{device:<14}{r.memory_gib:>12.1f} GiB{r.seconds:>13.1f}{over}")
    lines += ["-" * 51,
              f"iteration wall time {wall:.1f} s (rollout + train on gpu; exploration "
              f"{'fits in' if by_stage['explore'].seconds <= gpu_s else 'runs past'} it)",
              "per iteration: " + ", ".join(
                  f"{cls} {hours[cls]:.3f} GPU-h ${cost[cls]:.2f} at ${prices[cls]:.2f}/GPU-h"
                  for cls in workers) + f"; total ${sum(cost.values()):.2f}",
              plan_line, *node_lines(config, table, workers), "", "how:"]
    lines += [f"  {r.stage}: {r.how}" for r in rows]
    lines += ["  memory: weights (transformer + VAE + adapter) x bytes per weight; inference "
              f"activations of one block ({INFERENCE_ACTIVATIONS} x batch x tokens x width); "
              "training activations of every block (16 x micro-batch x tokens x width x "
              "layers), or with model.gradient_checkpointing each block's input and one "
              "block's internals, x2 with true CFG; fp32 gradients and two Adam moments of the "
              "trainable parameters; rollout latents of every step kept for the log-probabilities",
              f"  times as measured by check-gpu on an H200 in bf16 (gpu_speed {gpu_speed:g}; an "
              f"H100's bf16 compute is the same); cost = workers x wall time x "
              f"price per GPU-hour ({config.cost.prices})"]
    return "\n".join(lines)


