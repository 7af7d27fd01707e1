"""Validation: replay a measured run's iterations through the simulator and compare the times.

A run store records every task of every iteration (stage, worker, start, end). The replay
feeds those recorded durations, the run's worker counts and its mode into the simulator's own
machinery -- request stages under the real dispatcher, training as a span on the on-demand
worker, stale exploration on the spot worker from the iteration's start (or the training's)
until the deadline; a spot worker shared with the rollout pulls its requests after the stale
tasks it ran first, as recorded -- and sums the critical path, with the driver's seconds at
each boundary of it (task round trips, seed selection, manifest writes:
``timing.driver_s_per_stage`` at paper scale). That one parameter is calibrated out of
sample: each iteration is replayed with the median driver seconds of the *other* compared
iterations, never its own. Validation is not
a task, so validated iterations are not compared, nor the first, which warms the workers up.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spotlight.cost import CostLedger
from spotlight.scheduling import dispatch_events
from spotlight.scheduling.dispatch import Dispatcher, Offload
from spotlight.sim.clock import Clock
from spotlight.sim.config import SimConfig
from spotlight.sim.fleet import Fleet
from spotlight.sim.stage import RequestStage, Work

REQUEST_STAGES = ("rollout", "explore-sync")   # on the critical path, pulled by workers
STALE_STAGES = ("explore", "audit")            # stale exploration beside it, on spot workers


@dataclass(frozen=True)
class RecordedIteration:
    """One iteration of a measured run: its wall time and its tasks (run store records)."""

    wall_s: float
    validated: bool
    tasks: tuple[dict, ...]


def worker_class(worker: str) -> str:
    """The embedded cluster names its workers ``gpu-N`` and ``spot-N``."""
    return "spot" if str(worker).startswith("spot") else "gpu"


def _work(tasks: list[dict]) -> list[Work]:
    return [Work(f"{t['stage']}-{i}", int(t.get("samples") or 1), int(t.get("steps") or 1),
                 seconds=max(float(t["end"]) - float(t["start"]), 0.0))
            for i, t in enumerate(sorted(tasks, key=lambda t: t["start"]))]


def _segments(tasks: list[dict]) -> list[tuple[str, list[dict]]]:
    """The critical path's tasks in order, consecutive tasks of one stage together."""
    out: list[tuple[str, list[dict]]] = []
    for task in sorted(tasks, key=lambda t: t["start"]):
        if out and out[-1][0] == task["stage"]:
            out[-1][1].append(task)
        else:
            out.append((task["stage"], [task]))
    return out


def _spot_held(stale: list[dict], group: list[dict]) -> float:
    """Seconds into a request stage before its spot worker pulls: the simulator's stages do
    not share a worker between them, so the stale exploration tasks the spot worker ran
    first (started before its first request of the stage) keep it, as recorded."""
    spot = [float(t["start"]) for t in group if worker_class(t["worker"]) == "spot"]
    if not spot:
        return 0.0
    begun = min(float(t["start"]) for t in group)
    held = [float(t["end"]) for t in stale
            if worker_class(t["worker"]) == "spot" and float(t["start"]) < min(spot)
            and float(t["end"]) > begun]
    return max(held, default=begun) - begun


def critical_path(iteration: RecordedIteration) -> list[tuple[str, list[dict]]]:
    """The iteration's critical-path tasks in order, consecutive tasks of one stage together:
    everything but the stale exploration beside it, and of the request stages only what ran
    on gpu workers or was pulled (``REQUEST_STAGES``)."""
    return _segments([t for t in iteration.tasks if t["stage"] not in STALE_STAGES
                      and (worker_class(t["worker"]) == "gpu" or t["stage"] in REQUEST_STAGES)])


def driver_seconds(iteration: RecordedIteration) -> float:
    """The driver's seconds per boundary of the critical path in a recorded iteration: its
    wall time less the spans of its stages, over the boundaries (before, between, after)."""
    segments = critical_path(iteration)
    spans = sum(max(float(t["end"]) for t in group) - min(float(t["start"]) for t in group)
                for _, group in segments)
    return max(iteration.wall_s - spans, 0.0) / (len(segments) + 1)


def replay_iteration(iteration: RecordedIteration, *, gpu_workers: int, spot_workers: int,
                     window: str = "iteration", deadline: bool = True,
                     driver_s: float = 0.0) -> float:
    """Simulated seconds of one recorded iteration, ``driver_s`` at each boundary of its
    critical path."""
    config = SimConfig(name="replay", systems=["spotlight"]).with_values({
        "cluster.ondemand_gpus": gpu_workers, "cluster.gpus_per_spot_instance": 1,
        "cluster.spot_ratio": spot_workers / gpu_workers, "timing.resume_s": 0.0})
    clock = Clock(horizon_s=1e9)
    fleet = Fleet(clock, config, spot=spot_workers > 0, elastic=True,
                  ledger=CostLedger(), trace=None)
    tasks = list(iteration.tasks)
    stale = [t for t in tasks if t["stage"] in STALE_STAGES]
    exploration: RequestStage | None = None

    def start_exploration(until: float | None) -> RequestStage:
        return RequestStage(clock, fleet, config.timing, _work(stale), classes=("spot",),
                            commit_steps=True, deadline=until, name="explore")

    if stale and window == "iteration":
        exploration = start_exploration(None)
    for stage, group in critical_path(iteration):
        clock.advance_to(clock.now + driver_s)
        if stage in REQUEST_STAGES:
            classes = tuple(sorted({worker_class(t["worker"]) for t in group}))
            RequestStage(clock, fleet, config.timing, _work(group), classes=classes,
                         commit_steps=True, name=stage,
                         join_after={"spot": _spot_held(stale, group)}).run()
            continue
        seconds = max(float(t["end"]) - float(t["start"]) for t in group)
        if stage == "train" and stale and window == "train":
            exploration = start_exploration(clock.now + seconds if deadline else None)
        if stage == "train" and exploration is not None and deadline:
            clock.at(clock.now + seconds, exploration.close)
        clock.advance_to(clock.now + seconds)
    clock.advance_to(clock.now + driver_s)
    if exploration is not None and not deadline:
        exploration.run()
    return clock.now


def validate_replay(iterations: list[RecordedIteration], **options) -> dict:
    """Mean measured and simulated iteration seconds over the iterations that ran no
    validation, after the first (which warms the workers: weights loaded, kernels chosen),
    and the relative error of the simulated mean. Each iteration's driver seconds are the
    median of the other compared iterations' (``error_without_driver``: with none at all)."""
    compared = [it for it in iterations[1:] if not it.validated]
    if len(compared) < 2:
        raise ValueError(f"the run has {len(compared)} iteration(s) without validation after "
                         "the first; at least 2 are needed (one calibrates the driver's seconds "
                         "for the other): run more iterations, validating rarely")
    drivers = [driver_seconds(it) for it in compared]
    measured = [it.wall_s for it in compared]
    simulated = [replay_iteration(it, driver_s=float(np.median(drivers[:i] + drivers[i + 1:])),
                                  **options) for i, it in enumerate(compared)]
    bare = [replay_iteration(it, **options) for it in compared]
    mean_m, mean_s = float(np.mean(measured)), float(np.mean(simulated))
    return {"measured_s": mean_m, "simulated_s": mean_s,
            "error": abs(mean_s - mean_m) / mean_m, "iterations": len(compared),
            "driver_s_per_stage": float(np.median(drivers)),
            "error_without_driver": abs(float(np.mean(bare)) - mean_m) / mean_m,
            "per_iteration": [[m, s] for m, s in zip(measured, simulated)]}


def replay_decisions(events: list[dict]) -> list[dict]:
    """The assignments the dispatcher makes on a live pool's recorded event sequence
    (``RequestPool.events``: its offload setting first, then every stimulus in order), in the
    live log's terms: request, attempt, worker name, resume step."""
    if not events or events[0].get("event") != "Offload":
        raise ValueError("a recorded event sequence starts with the pool's offload setting; "
                         "record it with RequestPool.events")
    offload = events[0]["offload"]
    dispatcher = Dispatcher(offload=None if offload is None else Offload(
        speculate_on=tuple(offload["speculate_on"]), margin_s=offload["margin_s"]))
    decided = []
    for record in events[1:]:
        for action in dispatcher.handle(dispatch_events.event_from_record(record)):
            if isinstance(action, dispatch_events.Assign):
                decided.append({"request": action.request, "attempt": action.attempt,
                                "worker": action.worker, "resume_step": action.resume_step})
    return decided
