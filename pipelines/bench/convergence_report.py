"""The figures of ``bench convergence`` from its saved jobs: paired ratios with bootstrap
intervals, iterations, time and dollars to the target per mode and seed, the stale-ranking
τ's, and the plot. Pure bookkeeping over :mod:`spotlight.evidence`; nothing here runs a model."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.bench.bench_modes import (
    baseline_of,
    planned_ratio,
    seed_mode,
    session_mode,
    split_mode,
    timing_modes,
)
from pipelines.bench.convergence_plot import plot_convergence
from pipelines.bench.convergence_time import iteration_times
from pipelines.bench.paired import cluster_part
from pipelines.bench.registry import machine
from spotlight.config import RunConfig
from spotlight.cost import run_prices
from spotlight.evidence import (
    bootstrap_median,
    crossing,
    curve_area,
    paired_ratios,
    quantiles,
    value_at,
)
from spotlight.models.prompts import world_prompts
from spotlight.rewards.geneval import strict_scores

SPOT_MODES = ("stale", "rlboost")   # fixed-capacity modes that rent the spot workers


def hourly_usd(config: RunConfig, mode: str) -> float:
    """What the mode's cluster costs an hour: its gpu workers on demand, and the spot workers
    where the mode uses them (vanilla and sync need none; spotlight-xR rents R times as many)."""
    prices = run_prices(config.cost)
    ratio = planned_ratio(mode) or (1 if seed_mode(mode) in SPOT_MODES else 0)
    spot = config.cluster.spot_workers * ratio
    return config.cluster.gpu_workers * prices["gpu"] + spot * prices["spot"]


def _censored(value: float | None, budget: float) -> float:
    """A run that never reached the target counts as reaching it right after the budget -- a
    bound in its favour, flagged in ``unreached``."""
    return budget if value is None else value


def per_mode(jobs: dict[str, dict], modes: list[str], seeds: list[int], target: float,
             iterations: int, every: int, budget: int) -> dict:
    """Per mode and seed: iterations to target (unreached ones censored just past the
    ``iterations`` cap), area under the curve and value at the fixed ``budget``."""
    out: dict[str, dict] = {}
    for mode in modes:
        runs = [jobs[f"{mode}-seed{s}"] for s in seeds]
        curves = [[tuple(p) for p in r["val_curve"]] for r in runs]
        its = [crossing(c, target) for c in curves]
        out[mode] = {
            "iterations_to_target": its,
            "unreached": sum(i is None for i in its),
            "censored": [_censored(i, iterations + every) for i in its],
            "auc": [curve_area(c, budget) for c in curves],
            "value_at_budget": [value_at(c, budget) for c in curves],
            "group_std": [float(np.mean([it["group_std"] for it in r["iterations"]]))
                          for r in runs],
            "audit_tau": [it["audit_tau"] for r in runs for it in r["iterations"]
                          if it["audit_tau"] is not None],
            "curves": curves,
        }
    return out


def tau_figures(spot_jobs: list[dict]) -> dict:
    """Kendall τ of stale against fresh rankings of random candidates: the audits of every
    iteration, by how many versions stale (1, 2, 4: probes), and over the course of training."""
    audits = [it["audit_tau"] for r in spot_jobs for it in r["iterations"]
              if it["audit_tau"] is not None]
    median, p10 = quantiles(audits, 0.5, 0.1)
    by_lag: dict[str, list[float]] = {}
    by_point: dict[str, list[float]] = {}
    for r in spot_jobs:
        for point, taus in r.get("lag_taus", {}).items():
            for lag, tau in taus.items():
                if tau is not None:
                    by_lag.setdefault(lag, []).append(tau)
                    if lag == "1":
                        by_point.setdefault(point, []).append(tau)
    over = {}
    for it in sorted({it["iteration"] for r in spot_jobs for it in r["iterations"]}):
        values = [x["audit_tau"] for r in spot_jobs for x in r["iterations"]
                  if x["iteration"] == it and x["audit_tau"] is not None]
        if values:
            over[str(it)] = float(np.median(values))
    return {"median": median, "p10": p10, "audits": len(audits),
            "over": "random candidates re-scored with fresh weights (unbiased)",
            "by_staleness": {lag: dict(zip(("median", "p10"), quantiles(v, 0.5, 0.1)),
                                       probes=len(v)) for lag, v in sorted(by_lag.items())},
            "by_iteration": over}


def stale_rankings(saved: dict[str, dict], modes: list[str], seeds: list[int],
                   product: str) -> dict:
    """The τ figures of every mode that explores with stale weights (the fixed arms and the
    planned modes audit each iteration): ``kendall_tau_by_mode``; by objective, of the fixed
    arms; and ``kendall_tau``, the fixed ``stale`` arm's where it ran (comparable across
    benches), else the product's -- a bench without the fixed arm still reports its τ."""
    by_mode = {m: tau_figures([saved[f"{m}-seed{s}"] for s in seeds]) for m in modes
               if session_mode(m) == "spotlight"}
    return {"kendall_tau": by_mode.get("stale") or by_mode.get(product) or tau_figures([]),
            "kendall_tau_by_objective": {split_mode(m)[0] or "flow-grpo": figures
                                         for m, figures in by_mode.items()
                                         if seed_mode(m) == "stale"},
            "kendall_tau_by_mode": by_mode}


def summarize(saved: dict[str, dict], facts: dict, seeds: list[int], config: RunConfig,
              png: Path) -> dict:
    """The contract keys over the seeds every mode has finished (and, once they ran, the
    cluster's seconds per iteration); draws the PNG."""
    modes, target, iterations = facts["modes"], facts["target"], facts["iterations"]
    done = [s for s in seeds if all(f"{m}-seed{s}" in saved for m in modes)]
    result = {"bench": "convergence", **facts, "seeds": len(done), "seed_list": done,
              "machine": machine()}
    if not done:
        return result
    figures = per_mode(saved, modes, done, target, iterations, facts["validation_every"],
                       facts.get("budget") or iterations)
    cluster = {m: saved.get(cluster_part(m, seeds[0])) for m in sorted(timing_modes(modes))}
    its = {m: figures[m]["censored"] for m in modes}
    s_per_it, times, explore_waits = iteration_times(
        saved, modes, cluster, done, its,
        config.cluster.spot_workers * config.cluster.threads_per_worker)

    by_mode = speedup_by_mode(modes, times, its)
    product = by_mode.get(facts.get("product", "spotlight"), {})
    costs = {m: [t / 3600.0 * hourly_usd(config, m) for t in ts] for m, ts in times.items()}
    result.update({
        "iterations_to_target": {m: figures[m]["iterations_to_target"] for m in modes},
        "unreached": {m: figures[m]["unreached"] for m in modes},
        "seconds_per_iteration": s_per_it,
        "explore_wait_s": explore_waits,
        # The measured modes' gpu path by stage (their cluster runs): what bounds an iteration.
        "stage_s": {m: run["stage_s"] for m, run in cluster.items()
                    if run is not None and run.get("stage_s")},
        "time_to_target_s": times,
        "cost_to_target_usd": costs,
        "to_target": to_target_medians(its, times, costs),
        "speedup_vs_vanilla": product.get("vs_vanilla"),
        "speedup_vs_sync": product.get("vs_sync"),
        "iteration_speedup_vs_vanilla": product.get("iterations_vs_vanilla"),
        "staleness_cost": paired_ratio("stale", "sync", its),   # stale's its ÷ fresh's
        "speedup_by_mode": by_mode,
        **stale_rankings(saved, modes, done, facts.get("product", "spotlight")),
        "best_baseline": best_baseline(modes, times),
        "group_std_gain": group_std_gain(figures),
        "auc": {m: bootstrap_median(figures[m]["auc"]) for m in modes},
        "auc_gain_vs_vanilla": {m: bootstrap_median(np.subtract(figures[m]["auc"],
                                                                figures["vanilla"]["auc"]))
                                for m in modes if m != "vanilla" and "vanilla" in modes},
        "value_at_budget": {m: figures[m]["value_at_budget"] for m in modes},
        "val_curves": {m: figures[m]["curves"] for m in modes},
        "planner_choices": {m: [[it["iteration"] + 1, *it["plan"]]
                                for it in saved[f"{m}-seed{done[0]}"]["iterations"]
                                if it.get("plan")]
                            for m in modes if planned_ratio(m)},
        "cluster_check": cluster_check(cluster, saved, seeds[0], target, s_per_it),
    })
    if config.world.task == "geneval":   # GenEval's pass/fail verdict per tag, at the budget
        result["strict_at_budget"] = strict_at_budget(saved, modes, done, config)
    plot_convergence(result, png)
    return result


def to_target_medians(its: dict[str, list], times: dict[str, list],
                      costs: dict[str, list]) -> dict:
    """Per mode: the median iterations, seconds and dollars to the target with 90% bootstrap
    intervals over the seeds (unreached targets censored past the cap, as everywhere here)."""
    return {m: {"iterations": bootstrap_median(its[m]), "time_s": bootstrap_median(times[m]),
                "cost_usd": bootstrap_median(costs[m])} for m in times}


def strict_at_budget(saved: dict[str, dict], modes: list[str], seeds: list[int],
                     config: RunConfig) -> dict:
    """Per mode: GenEval's strict score (every clause right) overall and per tag at the budget,
    median over seeds, beside the partial-credit mean."""
    prompts = world_prompts(config, "val")[:config.validation.max_prompts]
    out = {}
    for mode in modes:
        scores = [strict_scores(saved[f"{mode}-seed{s}"]["budget_val_rewards"], prompts)
                  for s in seeds]
        tags = sorted(scores[0]["strict_by_tag"])
        out[mode] = {"strict": float(np.median([x["strict"] for x in scores])),
                     "strict_by_tag": {t: float(np.median([x["strict_by_tag"][t]
                                                           for x in scores])) for t in tags},
                     "partial_mean": float(np.median([x["partial_mean"] for x in scores]))}
    return out


def paired_ratio(a: str, b: str, of: dict[str, list]) -> dict | None:
    """Median and 90% interval of ``of[a] / of[b]`` over paired seeds; None without both."""
    return bootstrap_median(paired_ratios(of[a], of[b])) if a in of and b in of else None


def speedup_by_mode(modes: list[str], times: dict[str, list], its: dict[str, list]) -> dict:
    """Every mode against the baselines, paired over seeds: in time against vanilla Flow-GRPO,
    sync, the mode's own objective without exploration (``vs_objective_alone``: what
    exploration adds on top of it) and the fastest mode without exploration
    (``vs_best_baseline``), and in iterations against vanilla."""
    best = best_baseline(modes, times)
    return {m: {"vs_vanilla": paired_ratio("vanilla", m, times),
                "vs_sync": paired_ratio("sync", m, times) if m != "sync" else None,
                "vs_objective_alone": (paired_ratio(baseline_of(m), m, times)
                                       if baseline_of(m) != m else None),
                "vs_best_baseline": paired_ratio(best, m, times) if best and best != m else None,
                "iterations_vs_vanilla": paired_ratio("vanilla", m, its)}
            for m in modes if m != "vanilla"}


def best_baseline(modes: list[str], times: dict[str, list]) -> str | None:
    """The mode without exploration (vanilla under any objective) whose median time to the
    target is the shortest: the strong baseline a reviewer compares against."""
    plain = [m for m in modes if seed_mode(m) == "vanilla" and m in times]
    return min(plain, key=lambda m: float(np.median(times[m]))) if plain else None


def group_std_gain(figures: dict) -> dict:
    """Each mode's mean within-group reward std over vanilla's: how much spread selection buys."""
    vanilla = float(np.mean(figures["vanilla"]["group_std"])) if "vanilla" in figures else 0.0
    return {m: float(np.mean(f["group_std"])) / vanilla if vanilla > 0 else None
            for m, f in figures.items()}


def cluster_check(cluster: dict[str, dict | None], saved: dict[str, dict], seed: int,
                  target: float, s_per_it: dict[str, float]) -> dict:
    """The first seed's cluster runs against the harness: the same validation curve (bit for
    bit), and the wall time against iterations x seconds per iteration -- to the target where
    the run reached it, else of the iterations it ran (it stops at the budget)."""
    out = {}
    for mode, run in cluster.items():
        job = saved.get(f"{mode}-seed{seed}")
        if run is None or job is None:   # a report while that seed's harness job still runs
            continue
        harness = [tuple(p) for p in job["val_curve"]]
        # The cluster sees the target only at a validation, so its wall time is to that
        # iteration: the estimate that time checks is the same iterations x seconds each.
        reached = run["iterations_to_target"]
        iterations = reached if reached is not None else len(run["iteration_s"])
        wall = run["time_to_target_s"] if reached is not None else run["wall_s"]
        estimate = iterations * s_per_it[mode]
        out[mode] = {"seed": seed,
                     "curve_matches_harness": same_validations(harness, run["val_curve"]),
                     "reached_target": reached is not None, "iterations": iterations,
                     "wall_s": wall, "estimate_s": estimate,
                     "relative_error": (estimate - wall) / wall if wall else None}
    return out


def same_validations(harness: list, cluster: list) -> bool:
    """Whether the cluster validated to the same reward wherever both validated (a cluster run
    also validates after its own last iteration, which the harness need not have): at least
    the base and one validation after it."""
    ours = {int(i): v for i, v in harness}
    common = [(int(i), v) for i, v in cluster if int(i) in ours]
    return len(common) >= 2 and all(ours[i] == v for i, v in common)
