"""Simulated systems side by side: time and cost to target, and the metrics behind them.

``simulate`` runs every configured system on one scenario and returns plain data (what the
bench writes as JSON); ``compare`` sets each system against on-demand Flow-GRPO.
"""
from __future__ import annotations

import time

import numpy as np

from spotlight.cost import load_prices, price_per_gpu_hour
from spotlight.scheduling.traces import SpotTrace, load_trace
from spotlight.sim.config import CLOUD_INSTANCES, SimConfig
from spotlight.sim.systems import SystemResult, SystemRun


def prices_for(config: SimConfig) -> dict[str, float]:
    """USD per GPU-hour of on-demand ("gpu") and spot GPUs: the cloud's 8x H100 instance."""
    table = load_prices(config.path(config.cluster.prices))
    instance = CLOUD_INSTANCES[config.cluster.cloud]
    return {"gpu": price_per_gpu_hour(table, config.cluster.cloud, instance, "on_demand"),
            "spot": price_per_gpu_hour(table, config.cluster.cloud, instance, "spot")}


def trace_for(config: SimConfig) -> SpotTrace | None:
    path = config.path(config.cluster.trace)
    return None if path is None else load_trace(path)


def summarize(result: SystemResult, images_per_iteration: int) -> dict:
    """One system's figures (JSON-ready)."""
    its = result.iterations
    mean_s = float(np.mean([r.seconds for r in its]))
    billed = sum(r.spot_billed_train_s for r in its)
    busy = sum(r.spot_busy_train_s for r in its)
    reached = result.iterations_to_target is not None
    dollars = result.cost_usd["total"]
    return {
        "iterations_to_target": result.iterations_to_target,
        "reached": reached,
        "time_to_target_h": result.end_s / 3600,
        "cost_usd": dollars,
        "cost_usd_by_market": {"ondemand": result.cost_usd.get("gpu", 0.0),
                               "spot": result.cost_usd.get("spot", 0.0)},
        "gpu_hours": result.gpu_hours,
        "preemptions": result.preemptions,
        "requests_preempted": {"hard": sum(r.hard_preemptions for r in its),
                               "graceful": sum(r.graceful_preemptions for r in its)},
        "iteration_s": mean_s,
        "rollout_s": float(np.mean([r.rollout_s for r in its])),
        "train_s": float(np.mean([r.train_s for r in its])),
        "images_per_s": images_per_iteration / mean_s,
        "images_per_usd": images_per_iteration * len(its) / dollars if dollars else None,
        "rollout_finish_spread_s": float(np.median([r.finish_spread_s for r in its])),
        "rollout_tail_idle_share": float(np.median([r.tail_idle_share for r in its])),
        "spot_idle_share_during_training": (1 - busy / billed) if billed > 0 else None,
        "mean_exploration_quality": float(np.mean([r.quality for r in its])),
        "plans": [r.plan for r in its if r.plan is not None][:200],
    }


def compare(systems: dict[str, dict]) -> dict:
    """Each system against on-demand: speedup (time to target), how many times cheaper, and
    RLBoost's two metrics (throughput and images per dollar, each over on-demand's)."""
    base = systems.get("ondemand")
    if base is None:
        return {}
    out: dict[str, dict] = {"speedup_vs_ondemand": {}, "cost_ratio_vs_ondemand": {},
                            "throughput_vs_ondemand": {}, "cost_efficiency_vs_ondemand": {}}
    for name, s in systems.items():
        both = s["reached"] and base["reached"]
        out["speedup_vs_ondemand"][name] = (base["time_to_target_h"] / s["time_to_target_h"]
                                            if both else None)
        out["cost_ratio_vs_ondemand"][name] = base["cost_usd"] / s["cost_usd"] if both else None
        out["throughput_vs_ondemand"][name] = s["images_per_s"] / base["images_per_s"]
        out["cost_efficiency_vs_ondemand"][name] = (
            s["images_per_usd"] / base["images_per_usd"]
            if s["images_per_usd"] and base["images_per_usd"] else None)
    return out


def simulate(config: SimConfig, *, timeline_iteration: int | None = None) -> dict:
    """Every configured system on ``config``: per-system figures, the comparison, timelines."""
    prices, trace = prices_for(config), trace_for(config)
    started = time.perf_counter()
    systems, timelines = {}, {}
    for name in config.systems:
        result = SystemRun(config, name, trace, prices, timeline_iteration).run()
        systems[name] = summarize(result, config.workload.images)
        timelines[name] = result.spans
    return {"scenario": config.name, "prices_per_gpu_hour": prices,
            "trace": str(config.path(config.cluster.trace) or ""),
            "systems": systems, **compare(systems), "timelines": timelines,
            "sim_wall_s": time.perf_counter() - started}


def implied_ratio(config: SimConfig, bench: dict, headline_speedup: float) -> float:
    """The iteration ratio that gives Spotlight ``headline_speedup`` over on-demand in this
    scenario, from a run with the bench ratios: time to target is iterations x seconds per
    iteration, and Spotlight's iterations count for 1 + (r - 1) q of on-demand's (q: its mean
    exploration quality)."""
    od, sp = bench["systems"]["ondemand"], bench["systems"]["spotlight"]
    quality = max(sp["mean_exploration_quality"], 1e-6)
    per_iteration = headline_speedup * sp["iteration_s"] / od["iteration_s"]
    # Held to the range a config accepts: a Spotlight that hardly explored cannot be given
    # any headline, and the paper scenario then shows how far it falls short.
    return min(max(1.0 + (per_iteration - 1.0) / quality, 0.1), 100.0)


def paper_config(config: SimConfig, ratio: float) -> SimConfig:
    return config.with_values({"convergence.scenario": "paper",
                               "convergence.paper_spotlight_ratio": round(ratio, 4),
                               "convergence.paper_sync_ratio": round(ratio, 4)})

