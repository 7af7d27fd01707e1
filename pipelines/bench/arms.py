"""``spotlight bench arms``: what each exploration arm delivers, measured beside the planner's
choices -- the spread each candidate count N buys with fresh and with stale rankings, and how
fast a ranking goes stale.

A vanilla harness run trains the weights; at each probe iteration k one pool of
``pool`` candidate seeds per prompt is scored by the rollout's sampler under θ_k (fresh) and
under θ_k-lag for each lag (stale). A rollout of seeds under θ_k is exactly their fresh replay
(the same noise per seed and step), so the group a selection picks can be judged without
rolling it out: for each arm N (the first N candidates of the pool) and each ranking, the G
seeds the selection rule keeps, and their fresh rewards' spread against that of random groups
of G from the same pool (``spread_gain``: what GRPO's advantages get, the planner's payoff).
Kendall τ between fresh and stale scores of the whole pool says how much of the ranking
survives each lag. The JSON is rewritten after every probe.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from pipelines.bench.learning import TASK_CONFIGS
from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.run.inprocess import InProcessRun
from spotlight.config import load_config
from spotlight.exploration import core
from spotlight.exploration.fidelity import grouped_kendall_tau

SETTINGS = {"planner.enabled": False, "exploration.deadline": False,
            "pretrain.time_budget_s": 86400.0}
QUICK = {"grpo.prompts_per_iteration": 2, "grpo.group_size": 4, "grpo.micro_batch": 8,
         "exploration.request_batch": 4, "validation.max_prompts": 4}


def selected_spread(run_seed: int, iteration: int, ranking: core.PerPrompt,
                    fresh: core.PerPrompt, arm: int, group: int) -> float:
    """Mean over prompts of the fresh rewards' std of the G seeds the selection keeps among the
    first ``arm`` candidates, ranked by ``ranking``'s scores."""
    pools = [(s[:arm], r[:arm]) for s, r in ranking]
    chosen = core.select(run_seed, iteration, pools, group).seeds
    stds = []
    for seeds, (pool_seeds, pool_rewards) in zip(chosen, fresh):
        by_seed = dict(zip(pool_seeds, pool_rewards))
        stds.append(float(np.std([by_seed[int(s)] for s in seeds])))
    return float(np.mean(stds))


def random_spread(fresh: core.PerPrompt, group: int) -> float:
    """Mean fresh-reward std of random groups: every disjoint run of G candidates of each
    prompt's pool (drawn at random, so each is a random group), averaged."""
    return float(np.mean([np.std(r[i:i + group]) for _, r in fresh
                          for i in range(0, len(r) - group + 1, group)]))


def probe(harness: InProcessRun, k: int, pool: int, arms: list[int], lags: list[int]) -> dict:
    """One probe iteration: τ per lag over the pool, and per arm the spread gain of fresh and
    of each lag's stale ranking over random groups."""
    cfg, group = harness.config, harness.config.grpo.group_size
    fresh = harness.explore(k, k, pool, "audit")
    random_std = random_spread(fresh, group)
    rankings = {"fresh": fresh}
    taus = {}
    for lag in [lag for lag in lags if lag <= k]:
        rankings[f"stale-{lag}"] = harness.explore(k, k - lag, pool, "audit")
        tau = grouped_kendall_tau([r for _, r in rankings[f"stale-{lag}"]],
                                  [r for _, r in fresh])
        taus[str(lag)] = None if np.isnan(tau) else float(tau)
    gains = {name: {str(n): selected_spread(cfg.seed, k, ranking, fresh, n, group) / random_std
                    if random_std > 1e-9 else None for n in arms}
             for name, ranking in rankings.items()}
    return {"iteration": k, "random_std": random_std, "tau": taus, "spread_gain": gains}


@register_bench("arms")
def bench_arms(task: str = "ocr", quick: bool = False, config: str | None = None,
               json_path: str | None = None, iterations: int | None = None,
               overrides: dict | None = None, **_: object) -> dict:
    if task not in TASK_CONFIGS and config is None:
        raise ValueError(f"--task {task!r} is not known; choose one of {sorted(TASK_CONFIGS)}")
    cfg = load_config(config or TASK_CONFIGS[task],
                      {**SETTINGS, **(QUICK if quick else {}), **(overrides or {})})
    torch.set_num_threads(cfg.cluster.threads_per_worker)
    group = cfg.grpo.group_size
    pool = 4 * group if quick else 64
    # Around the planner's arms (1.5 and 2 x G on GenEval) and up to the whole pool.
    arms = sorted({n for n in (3 * group // 2, 2 * group, 3 * group, 4 * group, pool)
                   if group < n <= pool})
    lags = [1, 2, 4]
    every = 1 if quick else 4
    last = iterations or (2 if quick else 16)
    started = time.monotonic()
    harness = InProcessRun(cfg, "vanilla", base_val_reward=0.0)
    result = {"bench": "arms", "task": cfg.world.task, "config": cfg.source, "pool": pool,
              "arms": arms, "lags": lags, "group_size": group,
              "prompts": cfg.grpo.prompts_per_iteration, "overrides": dict(overrides or {}),
              "objective": cfg.objective.kind, "planner_arms":
              {"candidates": cfg.planner.candidates, "steps": cfg.planner.steps},
              "probes": [], "machine": machine()}
    try:
        for k in range(last + 1):
            if k and k % every == 0:
                result["probes"].append(probe(harness, k, pool, arms, lags))
                print(f"probe at {k}: τ {result['probes'][-1]['tau']} spread gain "
                      f"{result['probes'][-1]['spread_gain']}", flush=True)
                result["wall_s"] = time.monotonic() - started
                write_result(summarize_arms(result), json_path)
            if k < last:
                harness.iteration(k, False, False)
    finally:
        harness.close()
    result["wall_s"] = time.monotonic() - started
    return summarize_arms(result)


def median_of(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def summarize_arms(result: dict) -> dict:
    """Medians over the probes: spread gain per ranking and arm, τ per lag."""
    probes = result["probes"]
    gains: dict[str, dict[str, float | None]] = {}
    for p in probes:
        for name, by_arm in p["spread_gain"].items():
            for arm, gain in by_arm.items():
                gains.setdefault(name, {}).setdefault(arm, []).append(gain)
    taus: dict[str, list] = {}
    for p in probes:
        for lag, tau in p["tau"].items():
            taus.setdefault(lag, []).append(tau)
    return {**result,
            "median_spread_gain": {name: {arm: median_of(v) for arm, v in by_arm.items()}
                                   for name, by_arm in gains.items()},
            "median_tau": {lag: median_of(v) for lag, v in taus.items()}}
