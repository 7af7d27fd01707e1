"""Preemption injection on the embedded cluster: replay a spot trace, or preempt at a rate.

Real process kills, not simulated ones: a drop in the trace SIGKILLs spot worker processes
(no warning, as when a VM vanishes) or sends them SIGTERM (the notice path: the worker hands
its requests back and retires); a rise starts fresh spot worker processes. A trace of more
nodes than the embedded cluster holds is scaled to its spot-worker cap, keeping the timing of
every drop and rise. Victims are chosen from the seed, so a replay is repeatable. A run that
outlives the trace replays it again from its start.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

import numpy as np

from pipelines.cluster.connect import SPOT, ClusterError, ClusterHandle, worker_spec
from spotlight.config import ClusterConfig, InjectorConfig
from spotlight.scheduling.traces import (
    ReplayEvent,
    SpotTrace,
    choose_victims,
    initial_count,
    load_trace,
    poisson_trace,
    replay_period_s,
    replay_schedule,
    scale_to_cap,
)

EventFn = Callable[[str, dict], None]
POISSON_HOURS = 24.0   # a Poisson "trace" long enough for any run; the replay stops with the run


def injection_trace(config: InjectorConfig, cap: int) -> SpotTrace | None:
    """The trace ``config`` asks for, scaled to ``cap`` spot workers; None if it asks none."""
    if config.trace:
        return scale_to_cap(load_trace(config.trace), cap)
    if config.poisson_rate_per_hour > 0:
        return poisson_trace(config.poisson_rate_per_hour, cap, POISSON_HOURS * 3600.0,
                             config.seed, config.restart_after_s)
    return None


class SpotFleet:
    """The embedded cluster's spot worker processes: list them, preempt one, start new ones."""

    def __init__(self, handle: ClusterHandle, cluster_config: ClusterConfig,
                 note: Callable[..., None] | None = None) -> None:
        if handle.cluster is None:
            raise ClusterError("preemption injection needs the embedded cluster (it kills and "
                               "starts worker processes on this machine); drop --scheduler, or "
                               "preempt your own cluster's spot workers")
        self.handle, self.cluster_config = handle, cluster_config
        self.note = note or (lambda kind, **info: None)
        self._draining: set[str] = set()   # noticed; they retire themselves
        self._next_name = len(self.names())

    def names(self) -> list[str]:
        """Names of the spot workers that are up or starting (not noticed, not killed)."""
        self._reap()
        spec = self.handle.cluster.worker_spec
        return sorted(n for n, s in spec.items()
                      if s["options"]["resources"].get(SPOT) and n not in self._draining)

    def _reap(self) -> None:
        """Forget noticed workers once they have retired. Until then they stay in the spec:
        SpecCluster would otherwise close them itself, in the middle of their hand-back."""
        cluster = self.handle.cluster
        for name in sorted(self._draining):
            nanny = cluster.workers.get(name)
            if nanny is None or nanny.pid is None or nanny.status.name in (
                    "closing", "closed", "failed", "closing_gracefully"):
                cluster.worker_spec.pop(name, None)
                self._draining.discard(name)

    def pid(self, name: str) -> int | None:
        nanny = self.handle.cluster.workers.get(name)
        return getattr(nanny, "pid", None)

    def preempt(self, name: str, action: str = "kill") -> bool:
        """SIGKILL spot worker ``name`` (``kill``) or send it the SIGTERM notice (``notice``)."""
        cluster = self.handle.cluster
        nanny = cluster.workers.get(name)
        pid = getattr(nanny, "pid", None)
        if nanny is None or pid is None:
            self.note("skipped", worker=name, why="no such worker process")
            return False
        if action == "kill":
            nanny.close_gracefully()      # marks it: the nanny must not restart its worker
            os.kill(pid, signal.SIGKILL)
            cluster.worker_spec.pop(name, None)   # gone for good, like a reclaimed VM
        else:
            self._draining.add(name)
            os.kill(pid, signal.SIGTERM)  # the worker's PreemptionWatch takes it from here
        self.note(action, worker=name, pid=pid)
        return True

    def add(self, count: int) -> list[str]:
        """Start ``count`` fresh spot worker processes (they join the scheduler by themselves)."""
        cluster = self.handle.cluster
        names = []
        for _ in range(count):
            while f"spot-{self._next_name}" in cluster.workers:
                self._next_name += 1
            name = f"spot-{self._next_name}"
            self._next_name += 1
            cluster.worker_spec[name] = worker_spec(name, SPOT, self.cluster_config,
                                                     self.handle.log_file)
            names.append(name)
        self._reap()
        cluster.sync(cluster._correct_state)   # the way SpecCluster.scale starts new workers
        for name in names:
            self.note("start", worker=name)
        return names


class PreemptionInjector:
    """Replays a trace against the spot workers of an embedded cluster, in a thread."""

    def __init__(self, handle: ClusterHandle, config: InjectorConfig, cluster_config: ClusterConfig,
                 *, on_event: EventFn | None = None) -> None:
        cap = cluster_config.spot_workers
        if cap < 1:
            raise ClusterError("preemption injection needs spot workers; set "
                               "cluster.spot_workers ≥ 1")
        self.fleet = SpotFleet(handle, cluster_config, self._note)
        self.config = config
        self.trace = injection_trace(config, cap)
        if self.trace is None:
            raise ValueError("InjectorConfig: set injector.trace or injector.poisson_rate_per_hour")
        self.schedule: list[ReplayEvent] = replay_schedule(self.trace, config.time_scale)
        self.start_count = initial_count(self.trace)
        self.on_event = on_event or (lambda kind, info: None)
        self.rng = np.random.default_rng(config.seed)
        self.log: list[dict] = []       # every kill, notice and start, with its wall time
        self._drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotlight-injector", daemon=True)

    # -- control ---------------------------------------------------------------------------
    def start(self) -> "PreemptionInjector":
        self.t0 = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> "PreemptionInjector":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        """Replay the schedule; a run that outlives the trace replays it again (from the
        start's spot count), so a trace that ends with no node up cannot starve it."""
        period = replay_period_s(self.trace, self.config.time_scale)
        try:
            for replay in range(10**6 if period > 0 else 1):
                if replay:
                    self._note("trace_restart", replay=replay)
                self._apply(self.start_count - len(self.fleet.names()), trace_s=None)
                begin = self.t0 + replay * period
                for event in self.schedule:
                    if self._stop.wait(max(0.0, begin + event.at_s - time.time())):
                        return
                    self._apply(event.change, trace_s=event.trace_s)
                if self._stop.wait(max(0.0, begin + period - time.time())):
                    return
        except Exception as exc:  # noqa: BLE001 - an injector failure is reported, not fatal
            self._note("injector_error", error=f"{type(exc).__name__}: {exc}")

    # -- acting on the cluster --------------------------------------------------------------
    def _apply(self, change: int, trace_s: float | None) -> None:
        if change < 0:
            victims = choose_victims(self.fleet.names(), -change, self.rng)
            if len(victims) == len(self.fleet.names()):
                self._note("no_spot_left", trace_s=trace_s)
            for name in victims:
                self.fleet.preempt(name, self._action())
        elif change > 0:
            self.fleet.add(change)

    def _action(self) -> str:
        action = self.config.action
        if action == "mixed":
            action = "kill" if self._drops % 2 == 0 else "notice"
        self._drops += 1
        return action

    def _note(self, kind: str, **info) -> None:
        record = {"kind": kind, "at": time.time(), **info}
        self.log.append(record)
        self.on_event("injector", record)

    def summary(self) -> dict:
        kinds = [r["kind"] for r in self.log]
        return {"kills": kinds.count("kill"), "notices": kinds.count("notice"),
                "starts": kinds.count("start"), "events_planned": len(self.schedule),
                "start_count": self.start_count, "trace": self.trace.source,
                "time_scale": self.config.time_scale}
