"""Spot-capacity traces: parse real ones, scale them to a small cluster, replay them in fast time.

A trace is a step function of how many spot nodes are up. Two file formats exist (see
/work/shared/traces/README.md): a count trace (JSON, one count per tick) and an event trace (CSV
rows ``milliseconds,add|remove,nodeN``). Both become a :class:`SpotTrace`; the replay turns it
into wall-clock node changes for a local cluster. Pure functions, no Dask: the driver that kills
and starts workers consumes :func:`replay_schedule` and :func:`choose_victims`.
"""
from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ReplayEvent", "SpotTrace", "TraceError", "choose_victims", "initial_count",
           "load_trace", "poisson_trace", "replay_schedule", "scale_to_cap"]
FORMATS = "a JSON count trace or CSV rows 'milliseconds,add|remove,nodeN'"


class TraceError(ValueError):
    """An unreadable trace; the message names the file, the line or index, and the fix."""


@dataclass(frozen=True)
class SpotTrace:
    """Nodes up over time: ``counts`` keeps only changes, so every entry after the first is a
    preemption or a recovery and a replay never emits a no-op."""

    source: str
    counts: tuple[tuple[float, int], ...]
    duration_s: float

    def __post_init__(self) -> None:
        # Checked once here so that every consumer may rely on the shape of ``counts``.
        if not self.counts or self.counts[0][0] != 0.0:
            raise ValueError(f"{self.source}: counts must start with an entry at t=0")
        for (t0, c0), (t1, c1) in zip(self.counts, self.counts[1:]):
            if not t1 > t0 or c1 == c0:
                raise ValueError(f"{self.source}: counts must be strictly increasing in time and "
                                 f"keep only changes; got ({t0}, {c0}) then ({t1}, {c1})")
        if any(c < 0 for _, c in self.counts) or self.duration_s < self.counts[-1][0]:
            raise ValueError(f"{self.source}: counts must be >= 0 and duration_s >= the last time")

    @property
    def peak(self) -> int:
        """The most nodes ever up at once: the cluster size a replay needs without scaling."""
        return max(c for _, c in self.counts)

    def count_at(self, t: float) -> int:
        """Nodes up at trace time ``t`` (a change at ``t`` has already happened)."""
        if not t >= 0.0:
            raise ValueError(f"{self.source}: trace time must be >= 0; got {t}")
        return self.counts[bisect.bisect_right(self.counts, t, key=lambda e: e[0]) - 1][1]


def _steps(points: Iterable[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """Time-sorted (t, count) points to a change-only step function; a later point at the same
    time replaces an earlier one, so simultaneous events only count by their net effect."""
    out: list[tuple[float, int]] = []
    for t, c in points:
        if out and out[-1][0] == t:
            out.pop()
        if not out or out[-1][1] != c:
            out.append((float(t), int(c)))
    return tuple(out)


def _is_count(value: Any) -> bool:
    """A JSON count must be a whole number >= 0 (3.0 is accepted, True and 2.5 are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= 0 and float(value).is_integer()


def _parse_counts(source: str, text: str) -> SpotTrace:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"{source}:{err.lineno}: invalid JSON ({err.msg} at column {err.colno}); "
                         "fix the file or export the trace again") from None
    fix = 'expected {"metadata": {"gap_seconds": 300}, "data": [count, ...]}'
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) or not doc["data"]:
        raise TraceError(f"{source}: no 'data' list of counts; {fix}")
    meta = doc.get("metadata")
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap > 0 or gap == math.inf:
        raise TraceError(f"{source}: 'metadata.gap_seconds' = {gap!r} must be a number > 0 (the "
                         f"seconds between two counts); {fix}")
    for i, value in enumerate(doc["data"]):
        if not _is_count(value):
            raise TraceError(f"{source}: data[{i}] = {value!r}: expected a whole number >= 0 of "
                             "nodes up; fix or remove that entry")
    points = [(i * float(gap), int(c)) for i, c in enumerate(doc["data"])]
    return SpotTrace(source, _steps(points), len(points) * float(gap))


def _parse_events(source: str, text: str) -> SpotTrace:
    up: set[str] = set()
    points: list[tuple[float, int]] = [(0.0, 0)]
    last = 0.0
    fix = "expected 'milliseconds,add|remove,nodeN'; fix or remove the row"
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            ms = float(fields[0])
        except ValueError:
            if lineno == 1:   # a header row, only allowed as the very first line
                continue
            raise TraceError(f"{source}:{lineno}: milliseconds {fields[0]!r} is not a number; "
                             f"{fix}") from None
        if len(fields) != 3 or not fields[2]:
            raise TraceError(f"{source}:{lineno}: {len(fields)} field(s) in {line.strip()!r}; "
                             f"{fix}")
        action, node = fields[1].lower(), fields[2]
        if not math.isfinite(ms) or ms < 0:
            raise TraceError(f"{source}:{lineno}: milliseconds {fields[0]} must be a finite "
                             f"number >= 0; {fix}")
        if ms / 1000.0 < last:
            raise TraceError(f"{source}:{lineno}: time goes backwards ({fields[0]} ms after "
                             f"{last * 1000:g} ms); sort the rows by time")
        if action not in ("add", "remove"):
            raise TraceError(f"{source}:{lineno}: action {fields[1]!r} is neither 'add' nor "
                             f"'remove'; {fix}")
        if (action == "add") == (node in up):
            state = "already up" if node in up else "not up"
            raise TraceError(f"{source}:{lineno}: {action} of {node}, which is {state}; add a "
                             "node before removing it (and vice versa) or drop the row")
        (up.add if action == "add" else up.remove)(node)
        last = ms / 1000.0
        points.append((last, len(up)))
    if len(points) == 1:
        raise TraceError(f"{source}: no events; expected {FORMATS}")
    return SpotTrace(source, _steps(points), last)


def load_trace(path: str | Path) -> SpotTrace:
    """Read a count trace (JSON) or an event trace (CSV), told apart by content, not extension."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"{source}: not a text file; expected {FORMATS}") from None
    if not text.strip():
        raise TraceError(f"{source}: empty file; expected {FORMATS}")
    if text.lstrip()[0] in "{[":
        return _parse_counts(source, text)
    return _parse_events(source, text)


def scale_to_cap(trace: SpotTrace, cap: int) -> SpotTrace:
    """Shrink a trace to at most ``cap`` nodes while keeping when capacity moves.

    Plain rounding would erase most preemptions of a 16-node trace on a 2-worker cluster, yet the
    timing of each drop and rise is what a preemption test needs. So each change point moves at
    least one node in its original direction, unless the scaled count is already at 0 or ``cap``.
    """
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"cap must be a whole number >= 1 (the most spot nodes); got {cap!r}")
    peak = trace.peak
    if peak <= cap:
        return trace
    scaled: list[tuple[float, int]] = []
    for i, (t, c) in enumerate(trace.counts):
        target = round(c * cap / peak)
        if i > 0:
            prev_c, prev_s = trace.counts[i - 1][1], scaled[-1][1]
            if c < prev_c:
                target = min(target, max(prev_s - 1, 0))
            else:
                target = max(target, min(prev_s + 1, cap))
        scaled.append((t, target))
    return SpotTrace(trace.source, _steps(scaled), trace.duration_s)


def poisson_trace(rate_per_hour: float, nodes: int, duration_s: float, seed: int,
                  restart_after_s: float) -> SpotTrace:
    """A synthetic trace for when no measured one fits: each node, while up, is preempted at
    exponential intervals of mean 1/rate and comes back ``restart_after_s`` later."""
    for name, value, bound in (("rate_per_hour", rate_per_hour, "> 0"),
                               ("duration_s", duration_s, "> 0"),
                               ("restart_after_s", restart_after_s, ">= 0")):
        if not (math.isfinite(value) and (value > 0 or (value == 0 and bound == ">= 0"))):
            raise ValueError(f"{name} must be {bound} and finite; got {value}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a whole number >= 1; got {nodes!r}")
    rng = np.random.default_rng(seed)
    changes: list[tuple[float, int]] = []
    for _ in range(nodes):
        t = float(rng.exponential(3600.0 / rate_per_hour))
        while t < duration_s:
            changes.append((t, -1))
            t += restart_after_s
            if t >= duration_s:
                break
            changes.append((t, +1))
            t += float(rng.exponential(3600.0 / rate_per_hour))
    points, count = [(0.0, nodes)], nodes
    for t, delta in sorted(changes):
        count += delta
        points.append((t, count))
    return SpotTrace(f"poisson(rate_per_hour={rate_per_hour}, nodes={nodes}, seed={seed})",
                     _steps(points), float(duration_s))


@dataclass(frozen=True)
class ReplayEvent:
    """One capacity change of a replay: at ``at_s`` wall seconds after the replay starts,
    ``change`` spot nodes come (> 0) or go (< 0); ``trace_s`` says where it is in the trace."""

    at_s: float
    change: int
    trace_s: float


def _start(trace: SpotTrace, start_s: float | None) -> float:
    """The replay start in trace time: by default the first time any node is up, because the
    local cluster starts with its spot workers running and a leading empty stretch is idle time."""
    if start_s is None:
        return next((t for t, c in trace.counts if c > 0), 0.0)
    if not (math.isfinite(start_s) and 0.0 <= start_s <= trace.duration_s):
        raise ValueError(f"start_s must be within the trace, 0..{trace.duration_s} s; "
                         f"got {start_s}")
    return float(start_s)


def initial_count(trace: SpotTrace, start_s: float | None = None) -> int:
    """How many spot workers the cluster must have when the replay starts."""
    return trace.count_at(_start(trace, start_s))


def longest_outage_s(trace: SpotTrace, start_s: float | None = None) -> float:
    """The longest stretch of trace seconds after the replay start with no node up (an
    outage still open at the trace's end runs to ``duration_s``)."""
    start = _start(trace, start_s)
    longest, down_since = 0.0, None
    for t, c in trace.counts:
        if t < start:
            continue
        if c == 0 and down_since is None:
            down_since = t
        elif c > 0 and down_since is not None:
            longest, down_since = max(longest, t - down_since), None
    if down_since is not None:
        longest = max(longest, trace.duration_s - down_since)
    return longest


def replay_period_s(trace: SpotTrace, time_scale: float, start_s: float | None = None) -> float:
    """Wall seconds one replay of ``trace`` lasts, from its start to ``duration_s``: a run that
    outlives the trace replays it again from there (a trace that ends with no node up would
    otherwise leave the cluster without spot workers for good)."""
    return (trace.duration_s - _start(trace, start_s)) * time_scale


def replay_schedule(trace: SpotTrace, time_scale: float, *,
                    start_s: float | None = None) -> list[ReplayEvent]:
    """The changes after the start, in wall time: ``time_scale`` is wall seconds per trace second
    (0.01 turns a 300 s tick into 3 s), so a day of trace fits a test."""
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be > 0 and finite (wall seconds per trace second, "
                         f"e.g. 0.01); got {time_scale}")
    start = _start(trace, start_s)
    prev, events = trace.count_at(start), []
    for t, c in trace.counts:
        if t > start:
            events.append(ReplayEvent((t - start) * time_scale, c - prev, t))
            prev = c
    return events


def choose_victims(alive: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """Which ``min(n, len(alive))`` workers a drop removes. ``alive`` is sorted (and deduplicated)
    first, so the choice depends only on the set of names and the rng state, not on the order in
    which the scheduler happened to list its workers. Returned sorted."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (workers to remove); got {n}")
    pool = sorted(set(alive))
    k = min(n, len(pool))
    if k == 0:
        return []
    return sorted(pool[i] for i in rng.choice(len(pool), size=k, replace=False))
