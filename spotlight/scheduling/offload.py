"""Adaptive offload (RLBoost's first technique) as pure decisions over measured speeds.

A rollout's requests are pulled by every worker allowed to run them, on-demand and spot. Pulling
alone balances the bulk of a stage -- a fast worker comes back for more sooner -- but not its
tail: the last requests should go to whoever *finishes* them first, not to whoever is free
first. So at each free slot the dispatcher plans the queue by earliest finish time over every
worker's measured seconds per request (:func:`eft_plan`) and hands a request only to the free
workers that plan uses (:func:`planned_takers`); a slow spot worker then idles through the tail
instead of holding the stage's last request. When the queue is empty, an idle worker re-runs a
running request that it would finish clearly sooner than its current worker is expected to --
a straggler, or one on a worker about to vanish (:func:`straggler`); by the determinism contract
either attempt gives the same result, and the first committed one wins.

Speeds are measured, not declared: a worker's first request is planned with its class's mean
(or everyone's), and a worker nothing is known about yet is never held back.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Mapping


@dataclass
class SpeedBook:
    """Seconds per request of each worker: an exponential moving average of what it took."""

    weight: float = 0.5   # of the newest observation
    seconds: dict[str, float] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    # Class means, worked out once after each change: estimates are asked for every worker at
    # every event, observations come once per finished request.
    _means: dict[str | None, float | None] = field(default_factory=dict, repr=False)
    # The fastest and slowest measured seconds, kept while they stay exact (see ``bounds``).
    _bounds: tuple[float, float] | None = field(default=None, repr=False)

    def joined(self, worker: str, cls: str) -> None:
        self.classes[worker] = cls
        self._means.clear()

    def observe(self, worker: str, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"worker {worker!r} took {seconds} s for a request; expected >= 0")
        old = self.seconds.get(worker)
        new = seconds if old is None else (1 - self.weight) * old + self.weight * seconds
        self.seconds[worker] = new
        self._means.clear()
        if self._bounds is not None:
            low, high = self._bounds
            if old is not None and ((old == low and new > old) or (old == high and new < old)):
                self._bounds = None   # an extreme moved inwards: work it out again when asked
            else:
                self._bounds = (min(low, new), max(high, new))

    def bounds(self) -> tuple[float, float] | None:
        """The fastest and slowest measured seconds per request (None before any): every
        estimate lies between them, since it is a measurement or a mean of measurements."""
        if self._bounds is None and self.seconds:
            values = self.seconds.values()
            self._bounds = (min(values), max(values))
        return self._bounds

    def estimate(self, worker: str) -> float | None:
        """The worker's own average, else its class's mean, else everyone's, else None."""
        if worker in self.seconds:
            return self.seconds[worker]
        cls = self.classes.get(worker)
        if cls not in self._means:
            same = [s for w, s in self.seconds.items() if self.classes.get(w) == cls]
            known = same or list(self.seconds.values())
            self._means[cls] = sum(known) / len(known) if known else None
        return self._means[cls]


def eft_plan(ready_at: Mapping[str, list[float]], per_request: Mapping[str, float],
             queued: int, until_each_of: Collection[str] = ()) -> Counter:
    """How many of ``queued`` equal requests each worker gets when each one goes, in turn, to
    the slot that would finish it first. ``ready_at``: per worker, when each of its slots is
    free (now for a free slot); ``per_request``: its seconds per request. With
    ``until_each_of``, planning stops once each of those workers has a request (a caller that
    asks only which of them get one need not plan a long queue to its end)."""
    heap = [(ready + per_request[w], w, i) for w, slots in ready_at.items()
            for i, ready in enumerate(slots)]
    heapq.heapify(heap)
    plan: Counter = Counter()
    waiting = set(until_each_of)
    for _ in range(queued):
        if not heap:
            break
        finish, worker, slot = heapq.heappop(heap)
        plan[worker] += 1
        if waiting:
            waiting.discard(worker)
            if not waiting:
                break
        heapq.heappush(heap, (finish + per_request[worker], worker, slot))
    return plan


def planned_takers(free: list[str], ready_at: Mapping[str, list[float]],
                   per_request: Mapping[str, float | None], queued: int) -> list[str]:
    """The free workers that should take a request now: all of them while any speed is unknown
    (nothing to plan with), else those :func:`eft_plan` gives at least one request."""
    if any(per_request.get(w) is None for w in ready_at):
        return list(free)
    plan = eft_plan(ready_at, {w: float(s) for w, s in per_request.items() if s is not None},
                    queued, until_each_of=free)
    return [w for w in free if plan[w] > 0]


def straggler(running: Mapping[str, float], idle_finish: float, margin: float) -> str | None:
    """The running request to re-run on an idle worker that would finish one at ``idle_finish``:
    the one expected to end last, if it is expected to end more than ``margin`` seconds after
    that. ``running``: request -> its expected end."""
    if not running:
        return None
    request = max(sorted(running), key=lambda r: running[r])
    return request if running[request] > idle_finish + margin else None
