"""The simulated GPUs: on-demand groups that stay, spot instances that follow a trace.

Requests run on *units*: a sequence-parallel group of ``timing.sp_degree`` GPUs (one GPU when
the degree is 1). On-demand units never change. Spot instances come and go as the trace says;
their GPUs, once they hold the weights, are packed into groups, and a group that loses a member
is broken: its other members return to the pool and regroup. How fast that happens is what
separates the systems (:class:`Recovery`): Spotlight's persistent executors keep their weights
and rebuild the communicator in well under a second; a system that restarts the group's
processes reloads weights and builds a communicator from scratch.

Who is billed is kept in the project's :class:`~spotlight.cost.CostLedger` (one entry per GPU,
alive from the instance's start to its end, busy or not).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spotlight.cost import CostLedger
from spotlight.scheduling.traces import SpotTrace, choose_victims, scale_to_cap
from spotlight.sim.clock import Clock
from spotlight.sim.config import SimConfig
from spotlight.sim.model import comm_init_seconds


@dataclass(frozen=True)
class Recovery:
    """Seconds a system takes to put spot GPUs to work."""

    newcomer_s: float      # a new instance's GPU: boot and imports, then the weights
    survivor_s: float      # a broken group's surviving GPU until it holds weights again
    form_s: float          # building a group's communicator from GPUs that hold weights

    @classmethod
    def of(cls, config: SimConfig, elastic: bool) -> "Recovery":
        t, degree = config.timing, config.timing.sp_degree
        newcomer = t.process_start_s + t.peer_copy_s   # both spot systems pull from a live peer
        if elastic:   # persistent executors: survivors keep their weights in memory
            return cls(newcomer, 0.0, t.elastic_regroup_s if degree > 1 else 0.0)
        # A broken communicator takes its processes down: they restart and re-pull weights.
        return cls(newcomer, t.peer_copy_s if degree > 1 else 0.0, comm_init_seconds(t, degree))


@dataclass
class Unit:
    name: str
    cls: str                     # "gpu" (on-demand) or "spot"
    gpus: tuple[str, ...]
    ready: bool = False
    noticed: bool = False


class FleetListener(Protocol):
    def unit_ready(self, unit: Unit) -> None: ...
    def unit_notice(self, unit: Unit) -> None: ...
    def unit_lost(self, unit: Unit) -> None: ...


def scaled_counts(trace: SpotTrace, instances: int) -> list[tuple[float, int]]:
    """The trace's (time, nodes up) steps in instances of this cluster: shrunk as
    :func:`~spotlight.scheduling.traces.scale_to_cap` shrinks (every change still moves one
    instance), or grown in proportion to the trace's peak (a node becomes several instances,
    taken together, as co-located spot capacity is)."""
    if trace.peak >= instances:
        return list(scale_to_cap(trace, instances).counts)
    grown: list[tuple[float, int]] = []
    for t, count in trace.counts:
        target = round(count * instances / max(trace.peak, 1))
        if not grown or grown[-1][1] != target:
            grown.append((t, target))
    return grown


def count_at(counts: list[tuple[float, int]], t: float) -> int:
    return counts[bisect.bisect_right([c[0] for c in counts], t) - 1][1]


def capacity_changes(counts: list[tuple[float, int]], duration_s: float, speedup: float,
                     offset_s: float) -> Iterator[tuple[float, int]]:
    """(simulated time, instances up) changes after t=0, replaying the trace from its start
    whenever the run outlives it; time runs ``speedup`` times faster than the trace's."""
    if len(counts) < 2:   # capacity never changes
        return
    period = max(duration_s, counts[-1][0] + 1.0)
    loop, current = int(offset_s // period), count_at(counts, offset_s % period)
    while True:
        for t, count in counts:
            trace_t = loop * period + t
            if trace_t <= offset_s:
                current = count
                continue
            if count != current:
                yield (trace_t - offset_s) / speedup, count
                current = count
        loop += 1


class Fleet:
    """Units over time. ``spot``: whether the system rents spot instances at all."""

    def __init__(self, clock: Clock, config: SimConfig, *, spot: bool, elastic: bool,
                 ledger: CostLedger, trace: SpotTrace | None) -> None:
        self.clock, self.config, self.ledger = clock, config, ledger
        self.degree = config.timing.sp_degree
        self.recovery = Recovery.of(config, elastic)
        self.listeners: list[FleetListener] = []
        self.units: dict[str, Unit] = {}
        self.instances: dict[str, tuple[str, ...]] = {}   # alive spot instance -> its GPUs
        self.noticed: set[str] = set()
        self.free: list[str] = []                          # spot GPUs holding weights, no group
        self.gpu_unit: dict[str, str] = {}
        self.preemptions = 0
        self._spot_s, self._spot_since = 0.0, 0.0   # spot GPU-seconds billed, integrated
        self._rng = np.random.default_rng(config.cluster.victim_seed)
        self._serial = 0
        for i in range(config.cluster.ondemand_gpus // self.degree):
            gpus = tuple(f"od{i * self.degree + j}" for j in range(self.degree))
            self.units[f"od{i}"] = Unit(f"od{i}", "gpu", gpus, ready=True)
        for g in range(config.cluster.ondemand_gpus):
            ledger.worker_joined(f"od{g}", "gpu", 0.0)
        cap = config.cluster.spot_instances if spot else 0
        if cap <= 0:
            return
        counts = [(0.0, cap)] if trace is None else scaled_counts(trace, cap)
        offset = config.cluster.trace_offset_s
        period = max(trace.duration_s, counts[-1][0] + 1.0) if trace is not None else 1.0
        for _ in range(count_at(counts, offset % period)):
            self._add_instance(ready_at=0.0)
        self._regroup()
        if trace is not None:
            self._changes = capacity_changes(counts, trace.duration_s,
                                             config.cluster.trace_speedup, offset)
            self._schedule_next()

    # -- queries ---------------------------------------------------------------------------
    def ready_units(self, cls: str | None = None) -> list[Unit]:
        return [u for u in self.units.values()
                if u.ready and not u.noticed and (cls is None or u.cls == cls)]

    def spot_gpus_up(self) -> int:
        return sum(len(g) for g in self.instances.values())

    def spot_gpu_seconds(self) -> float:
        """Spot GPU-seconds billed from the start to now (busy or idle)."""
        return self._spot_s + self.spot_gpus_up() * (self.clock.now - self._spot_since)

    def _billing_changes(self) -> None:
        self._spot_s = self.spot_gpu_seconds()
        self._spot_since = self.clock.now

    # -- the trace -------------------------------------------------------------------------
    def _schedule_next(self) -> None:
        change = next(self._changes, None)
        if change is None:
            return
        t, count = change
        notice = self.config.cluster.notice
        self.clock.at(t - notice, self._before_change, t, count)

    def _before_change(self, t: float, count: int) -> None:
        """``notice`` seconds before a drop: choose the victims and warn their units."""
        self._schedule_next()
        alive = [name for name in self.instances if name not in self.noticed]
        drop = len(self.instances) - count
        victims = choose_victims(sorted(alive), min(max(drop, 0), len(alive)), self._rng) \
            if drop > 0 else []
        for name in victims if self.config.cluster.notice > 0 else ():   # else: no warning
            self.noticed.add(name)
            for unit in self._units_of(name):
                if not unit.noticed:
                    unit.noticed = True
                    for listener in list(self.listeners):
                        listener.unit_notice(unit)
        self.clock.at(t, self._change, count, tuple(victims))

    def _change(self, count: int, victims: tuple[str, ...]) -> None:
        for name in victims:
            if name in self.instances:
                self._remove_instance(name)
        while len(self.instances) < count:
            self._add_instance(ready_at=self.clock.now + self.recovery.newcomer_s)
        self._regroup()

    # -- instances and groups ----------------------------------------------------------------
    def _add_instance(self, ready_at: float) -> None:
        self._billing_changes()
        name = f"s{self._serial}"
        self._serial += 1
        gpus = tuple(f"{name}g{j}" for j in range(self.config.cluster.gpus_per_spot_instance))
        self.instances[name] = gpus
        for gpu in gpus:
            self.ledger.worker_joined(gpu, "spot", self.clock.now)
            self.clock.at(ready_at, self._gpu_ready, name, gpu)

    def _gpu_ready(self, instance: str, gpu: str) -> None:
        if instance in self.instances and gpu not in self.gpu_unit and gpu not in self.free:
            self.free.append(gpu)
            self._regroup()

    def _remove_instance(self, name: str) -> None:
        self.preemptions += 1
        self._billing_changes()
        gpus = self.instances.pop(name)
        self.noticed.discard(name)
        for gpu in gpus:
            self.ledger.worker_left(gpu, self.clock.now)
            if gpu in self.free:
                self.free.remove(gpu)
        for unit in self._units_of(name, gpus):
            self._break(unit, gone=set(gpus))

    def _units_of(self, instance: str, gpus: tuple[str, ...] | None = None) -> list[Unit]:
        gpus = gpus if gpus is not None else self.instances.get(instance, ())
        names = {self.gpu_unit[g] for g in gpus if g in self.gpu_unit}
        return [self.units[n] for n in sorted(names)]

    def _break(self, unit: Unit, gone: set[str]) -> None:
        del self.units[unit.name]
        was_ready = unit.ready
        unit.ready = False
        for gpu in unit.gpus:
            self.gpu_unit.pop(gpu, None)
            if gpu not in gone:   # a survivor: back to the pool once it holds weights
                instance = gpu.rsplit("g", 1)[0]
                self.clock.at(self.clock.now + self.recovery.survivor_s, self._gpu_ready,
                              instance, gpu)
        if was_ready:
            for listener in list(self.listeners):
                listener.unit_lost(unit)

    def _regroup(self) -> None:
        """Pack free GPUs into whole groups (instances that are not leaving first)."""
        usable = [g for g in self.free if g.rsplit("g", 1)[0] not in self.noticed]
        while len(usable) >= self.degree:
            gpus, usable = tuple(usable[:self.degree]), usable[self.degree:]
            for gpu in gpus:
                self.free.remove(gpu)
            name = f"sp{self._serial}"
            self._serial += 1
            unit = Unit(name, "spot", gpus)
            self.units[name] = unit
            for gpu in gpus:
                self.gpu_unit[gpu] = name
            form = self.recovery.form_s if self.degree > 1 else 0.0
            self.clock.at(self.clock.now + form, self._unit_ready, name)

    def _unit_ready(self, name: str) -> None:
        unit = self.units.get(name)
        if unit is None or unit.ready:
            return
        unit.ready = True
        for listener in list(self.listeners):
            listener.unit_ready(unit)
