"""Seconds per iteration in ``bench convergence``: measured on the cluster for the modes it ran,
modelled for the planned ones from their fixed-arm stale run and their own plans.

A planned mode's iteration is its stale run's critical path less that run's waits for
exploration (a plan is made to fit the window; the fixed arm need not), unless its own plan
says otherwise: under ``objective.train_on_explored`` the planner may explore every prompt past
the window (the iteration then waits for the overrun), or fall back to sampling the rollout
(which the stale run's explored iterations did not pay). Pure arithmetic over saved parts.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipelines.bench.bench_modes import objective_settings, planned_ratio, stale_of
from spotlight.exploration.planner import plan_cost

# Stages that are not part of a timed iteration's gpu path: the spot workers' (beside it), and
# validation (a measurement every mode pays alike, whose records are numbered by the weights it
# validates, the next iteration's).
OFF_THE_TIMED_PATH = ("explore", "audit", "validation")


def plain_iterations(cluster_run: dict) -> list[int]:
    """The iterations of a cluster run that time it: every one after the first (which warms
    the workers and, in stale exploration, has nothing explored yet) that ran no validation
    (validation measures; every mode pays it alike) -- or all of them, where none is plain."""
    validated = cluster_run["validated"]
    return [i for i, v in enumerate(validated) if i > 0 and not v] or list(range(len(validated)))


def stage_seconds(records: list[dict], iterations: list[int]) -> dict[str, float]:
    """Where a cluster run's gpu path goes: per stage, the median over ``iterations`` of the
    stage's span in each (its first start to its last end; 0 in one that did not run it), the
    stages in the order they first ran. Shows what bounds an iteration once the rollout is off
    it (training, on a world where it is the larger share)."""
    spans: dict[str, dict[int, tuple[float, float]]] = {}
    for r in sorted(records, key=lambda r: r["start"]):
        if r["stage"] in OFF_THE_TIMED_PATH or r["iteration"] not in iterations:
            continue
        by_iteration = spans.setdefault(r["stage"], {})
        first, last = by_iteration.get(r["iteration"], (r["start"], r["end"]))
        by_iteration[r["iteration"]] = (min(first, r["start"]), max(last, r["end"]))
    return {stage: float(np.median([end - start for start, end in
                                    (by_iteration.get(k, (0.0, 0.0)) for k in iterations)]))
            for stage, by_iteration in spans.items()}


def seconds_per_iteration(cluster_run: dict, fitted: bool = False) -> float:
    """Critical-path seconds of an iteration: the median over the :func:`plain_iterations`.
    ``fitted``: less the time the iteration waited for the next one's exploration -- what it
    takes when the exploration fits its window, as the planner's plans are made to (a run saved
    before the wait was measured has none)."""
    waits = cluster_run.get("explore_wait_s") if fitted else None
    seconds = np.subtract(cluster_run["iteration_s"], waits if waits else 0.0)
    return float(np.median([seconds[i] for i in plain_iterations(cluster_run)]))


def explore_wait_per_iteration(cluster_run: dict) -> float | None:
    """The median seconds an iteration of a cluster run waited for the next one's exploration,
    over the iterations :func:`seconds_per_iteration` takes (None: not measured): where it is
    not 0, exploration bounded the iteration."""
    waits = cluster_run.get("explore_wait_s")
    if not waits:
        return None
    return float(np.median([waits[i] for i in plain_iterations(cluster_run)]))


class PlannedIteration(NamedTuple):
    """A planned mode's modelled iteration: its mean seconds, and the mean of those seconds it
    spent waiting for its own plan's exploration past the gpu path (0 where every plan fit)."""
    seconds: float
    explore_wait_s: float


def planned_iteration(mode: str, job: dict, fitted_s: float, iterations: float,
                      spot_slots: int) -> PlannedIteration:
    """Planned ``mode``'s ``job`` over its first ``iterations`` iterations (all of them if it
    ran fewer): each the longer of the gpu path (``fitted_s``, plus the share of the rollout
    that a mode training on explored samples had to sample) and the exploration its plan
    started on its spot slots (``spot_slots`` per unit of its capacity ratio)."""
    _, per_step, rollout_s = (list(job.get("time_model") or []) + [None, None, None])[:3]
    reuses = bool(objective_settings(mode).get("objective.train_on_explored"))
    slots = (planned_ratio(mode) or 1) * spot_slots
    seconds, waits = [], []
    for it in job["iterations"][:max(1, int(np.ceil(iterations)))]:
        gpu = fitted_s
        if reuses and it["iteration"] > 0:   # the share of the rollout it still sampled
            unexplored = 0.0 if it.get("trained_on_explored", True) else 1.0
            gpu += (rollout_s or 0.0) * it.get("sampled", unexplored)
        explore = 0.0
        if it.get("plan") and per_step is not None:
            candidates, steps, prompts = it["plan"]
            explore = plan_cost(prompts, candidates, steps, per_step) / slots
        seconds.append(max(gpu, explore))
        waits.append(max(0.0, explore - gpu))
    if not seconds:
        return PlannedIteration(fitted_s, 0.0)
    return PlannedIteration(float(np.mean(seconds)), float(np.mean(waits)))


def iteration_times(saved: dict[str, dict], modes: list[str], cluster: dict[str, dict | None],
                    seeds: list[int], censored: dict[str, list[float]], spot_slots: int
                    ) -> tuple[dict[str, float], dict[str, list[float]], dict[str, float | None]]:
    """(seconds per iteration per mode, time to the target per mode and seed, seconds an
    iteration waited for exploration per mode): iterations to the target (censored) times the
    seconds. A measured mode's wait is its cluster run's (None: not measured); a planned mode's
    seconds and wait are modelled, each the median over seeds. The cluster ran with
    ``spot_slots`` spot slots (workers x threads)."""
    s_per_it = {m: seconds_per_iteration(c) for m, c in cluster.items() if c is not None}
    waits = {m: explore_wait_per_iteration(c) for m, c in cluster.items() if c is not None}
    times = {m: [i * s_per_it[m] for i in censored[m]] for m in s_per_it if m in censored}
    for mode in modes:
        stale = cluster.get(stale_of(mode))
        if not planned_ratio(mode) or stale is None:
            continue
        fitted = seconds_per_iteration(stale, fitted=True)
        per_seed = [planned_iteration(mode, saved[f"{mode}-seed{s}"], fitted, i, spot_slots)
                    for s, i in zip(seeds, censored[mode])]
        s_per_it[mode] = float(np.median([p.seconds for p in per_seed]))
        waits[mode] = float(np.median([p.explore_wait_s for p in per_seed]))
        times[mode] = [i * p.seconds for i, p in zip(censored[mode], per_seed)]
    return s_per_it, times, waits
