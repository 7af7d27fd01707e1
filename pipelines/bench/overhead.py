"""``spotlight bench overhead``: what the Dask pipeline costs over the same work in one process.

Three runs from the same base model and seeds, each streaming latents and saving checkpoints:
1. in-process: the pipeline's own task functions called in sequence (no Dask), one torch thread
   like a worker;
2. ``vanilla`` on the embedded cluster (1 gpu + 1 spot worker): the same iterations as futures;
3. ``spotlight`` on the same cluster: stale-weight exploration on the spot worker while the gpu
   worker trains.
``overhead_ratio`` = (2) / (1); ``critical_path_ratio`` = (3) / (2) iteration wall time;
``exploration_overlap`` = share of exploration task time while the gpu worker worked on the
iteration (rollout to checkpoint), from (3).
The three runs are repeated in rounds (three by default, the order reversed every other round) and the
ratios are taken over the sums.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pipelines.run import tasks
from pipelines.bench import machine, register_bench
from pipelines.front.session import Session
from pipelines.front.timeline import CRITICAL_STAGES, overlap_fraction, plot_timeline
from spotlight.config import RunConfig, load_config, shipped_config
from spotlight.models.base import base_policy
from spotlight.models.prompts import world_prompts
from spotlight.rewards import build_reward
from spotlight.rl.trainer import iteration_prompts, random_seeds
from storage import RunStore


def inprocess_iterations(config: RunConfig, store: RunStore, iterations: int) -> list[float]:
    """The pipeline's tasks called in order in this process; wall seconds per iteration."""
    base = base_policy(config, progress=False)
    store.save_checkpoint(0, base.state_dict(), None)
    train, val = world_prompts(config, "train"), world_prompts(config, "val")
    grpo = config.grpo
    tasks.validation_task(config, store, 0, val, 0)
    walls = []
    for k in range(iterations):
        start = time.time()
        prompts = iteration_prompts(train, k, grpo.prompts_per_iteration, config.seed)
        seeds = random_seeds(config.seed, k, len(prompts), grpo.group_size)
        rollout = tasks.rollout_task(config, store, tasks.RolloutRequest(k, prompts, seeds, k))
        reward = tasks.reward_task(config, store, rollout, prompts, grpo.group_size, k)
        adv = tasks.advantages_task(config, k, reward["rewards"], k)
        trained = tasks.train_task(config, store, rollout,
                                   tasks.TrainRequest(k, prompts, reward["rewards"], adv, k))
        store.commit_checkpoint(tasks.checkpoint_task(config, store, trained, k, k)["checkpoint"])
        if (k + 1) % config.validation.every == 0 or k + 1 == iterations:
            tasks.validation_task(config, store, k + 1, val, k + 1)
        walls.append(time.time() - start)
    tasks.forget_contexts()
    return walls


def _session_run(config: RunConfig, mode: str, url: str,
                 iterations: int) -> tuple[list, list, float]:
    """Results, task records, and the driver's manifest reads per iteration while it ran."""
    cfg = config.with_values({"mode": mode, "cluster.dashboard": False})
    with Session.from_config(cfg, store=url) as session:
        before = session.store.manifest.reads
        session.run(iterations)
        reads = (session.store.manifest.reads - before) / max(iterations, 1)
        return session.results, session.task_records(), reads


@register_bench("overhead")
def bench_overhead(quick: bool = False, config: str | None = None, iterations: int | None = None,
                   task: str = "ocr", json_path: str | None = None, rounds: int | None = None,
                   overrides: dict | None = None, **_: object) -> dict:
    started = time.monotonic()
    user_overrides, overrides = overrides or {}, {"validation.every": 4}
    if quick and config is None:
        # Half the batch, so the training window still holds a few exploration requests.
        overrides.update({"grpo.prompts_per_iteration": 8, "grpo.group_size": 4,
                          "grpo.micro_batch": 32, "validation.max_prompts": 8,
                          "exploration.candidates": 8, "exploration.request_batch": 4})
    cfg = load_config(config or shipped_config("digits.yaml"), {**overrides, **user_overrides})
    iterations = iterations or (2 if quick else 8)
    base_policy(cfg, progress=False)   # digits: pretrained once, into the cache
    build_reward(cfg.reward)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-overhead-"))
    # Rounds alternate the order (in-process, vanilla, spotlight, then the reverse): a slow
    # drift of a shared machine then weighs on every mode alike, not on whichever ran last.
    inprocess, vanilla, spot, spot_tasks, all_tasks, reads = [], [], [], [], [], []
    for r in range(rounds or (1 if quick else 3)):
        for run in ("inprocess", "vanilla", "spotlight")[:: 1 if r % 2 == 0 else -1]:
            url = str(root / f"{run}-{r}")
            if run == "inprocess":
                inprocess += inprocess_iterations(cfg, RunStore.open(url), iterations)
            elif run == "vanilla":
                vanilla += _session_run(cfg, "vanilla", url, iterations)[0]
            else:
                results, records, per_iteration = _session_run(cfg, "spotlight", url, iterations)
                reads.append(per_iteration)
                spot += results
                all_tasks += records
                spot_tasks = spot_tasks or records   # the timeline shows the first round
    # Iterations that explored for a next one (all but the last) against the same vanilla ones.
    explored = [i for i, r in enumerate(spot) if r.planned]
    spot_wall = sum(spot[i].wall_s for i in explored)
    vanilla_wall = sum(vanilla[i].wall_s for i in explored)
    timeline = Path(json_path).with_suffix(".timeline.png") if json_path else \
        root / "timeline.png"
    plot_timeline(spot_tasks, timeline, title="bench overhead: spotlight mode")
    dask_s = sum(r.wall_s for r in vanilla)
    inprocess_s = sum(inprocess)
    return {
        "bench": "overhead", "config": cfg.source, "iterations": iterations,
        "rounds": len(inprocess) // iterations,
        "inprocess_s": inprocess_s, "dask_s": dask_s, "overhead_ratio": dask_s / inprocess_s,
        "exploration_overlap": overlap_fraction(all_tasks, inner="explore", outer=CRITICAL_STAGES),
        "critical_path_ratio": spot_wall / vanilla_wall if vanilla_wall else None,
        "spotlight_iteration_s": [r.wall_s for r in spot],
        "vanilla_iteration_s": [r.wall_s for r in vanilla],
        "inprocess_iteration_s": inprocess,
        "explored_candidates": sum(r.explored for r in spot),
        "planned_candidates": sum(r.planned for r in spot),
        "filled_seeds": sum(r.filled for r in spot),
        # GETs of manifest.json by the driver per iteration (spotlight mode): the driver is its
        # only writer and keeps its own copy, so it reads it once when it opens the run.
        "manifest_reads_per_iteration": max(reads) if reads else None,
        "cost_usd": {"vanilla": vanilla[-1].cost_total_usd, "spotlight": spot[-1].cost_total_usd},
        "timeline_png": str(timeline), "runs": str(root),
        "wall_s": time.monotonic() - started, "machine": machine(),
    }
