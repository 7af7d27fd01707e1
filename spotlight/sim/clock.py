"""The simulated clock: a heap of timed callbacks, run in time order (ties in scheduling order).

Nothing sleeps: time jumps to the next event. Callbacks schedule further events; a system's
iteration advances the clock until its stage is done or a moment is reached.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable


class SimulationStuck(RuntimeError):
    """Waiting for something no scheduled event can bring about (e.g. no GPU will ever come)."""


class Clock:
    def __init__(self, horizon_s: float = math.inf) -> None:
        self.now = 0.0
        self.horizon_s = horizon_s   # a run that needs longer than this is stuck
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = 0

    def at(self, t: float, callback: Callable, *args) -> None:
        """Run ``callback(*args)`` at time ``t`` (now, if ``t`` is in the past)."""
        heapq.heappush(self._heap, (max(t, self.now), self._seq, callback, args))
        self._seq += 1

    def _step(self) -> None:
        t, _, callback, args = heapq.heappop(self._heap)
        self.now = t
        callback(*args)

    def advance_to(self, t: float) -> None:
        """Run every event up to and including time ``t``; the clock then reads ``t``."""
        while self._heap and self._heap[0][0] <= t:
            self._step()
        self.now = max(self.now, t)

    def run_until(self, done: Callable[[], bool], what: str) -> None:
        """Run events until ``done()``; stuck if the events run out or pass the horizon."""
        while not done():
            if not self._heap or self._heap[0][0] > self.horizon_s:
                raise SimulationStuck(f"the simulation cannot finish {what}: no event left "
                                      f"before {self.horizon_s:.0f} s (at {self.now:.1f} s); "
                                      "does the cluster have a GPU that can run it?")
            self._step()
