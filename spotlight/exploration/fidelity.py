"""Rank fidelity: do stale weights still rank a prompt's seeds the way fresh ones do?

Exploration scores candidate seeds with θ_k while θ_k+1 trains; its whole value rests on the
ranking surviving the update. Kendall's τ between the two sets of rewards measures exactly
that, per prompt (ranks only mean something within one prompt). A small state machine turns
the rolling τ into a decision: trust stale exploration, or fall back until it recovers.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from spotlight.config import FidelityConfig

TRUSTING, FALLBACK = "trusting", "fallback"


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-b of two equal-length sequences (ties handled); nan when undefined."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two equal-length 1-d sequences, got {x.shape} and "
                         f"{y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("kendall_tau got non-finite values; drop unscored samples first")
    if len(x) < 2:
        return float("nan")
    i, j = np.triu_indices(len(x), k=1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    concordance = float(np.sum(dx * dy))
    # τ-b: pairs tied in x (or y) count in neither denominator term of that side.
    n_x, n_y = float(np.count_nonzero(dx)), float(np.count_nonzero(dy))
    if n_x == 0 or n_y == 0:
        return float("nan")
    return concordance / math.sqrt(n_x * n_y)


def grouped_kendall_tau(x_groups: Sequence[Sequence[float]],
                        y_groups: Sequence[Sequence[float]]) -> float:
    """Mean per-group τ over the groups (prompts) where it is defined; nan if none is."""
    if len(x_groups) != len(y_groups):
        raise ValueError(f"{len(x_groups)} groups of x against {len(y_groups)} of y")
    taus = [kendall_tau(x, y) for x, y in zip(x_groups, y_groups)]
    taus = [t for t in taus if not math.isnan(t)]
    return float(np.mean(taus)) if taus else float("nan")


def audit_due(iteration: int, audit_every: int) -> bool:
    """Audits run every ``audit_every`` iterations from iteration 1 (0 = never)."""
    return audit_every > 0 and iteration > 0 and iteration % audit_every == 0


def audit_picks(seed: int, iteration: int, explored: Sequence[int], prompts: int,
                per_prompt: int) -> list[tuple[int, list[int]]]:
    """Which explored candidates an audit re-scores with fresh weights (deterministic).

    ``explored[p]`` is how many candidates prompt p has. Up to ``prompts`` prompts with at least
    two candidates are drawn at random, and up to ``per_prompt`` of each one's candidates:
    a random sample of the stale ranking, blind to which seeds selection kept, so its τ is
    unbiased (τ over the selected seeds is not: selection keeps the extremes).
    """
    rng = np.random.default_rng([seed, iteration, 0xA0D17])
    eligible = [p for p, n in enumerate(explored) if n >= 2]
    if not eligible:
        return []
    chosen = np.sort(rng.choice(eligible, size=min(prompts, len(eligible)), replace=False))
    return [(int(p), sorted(int(c) for c in rng.choice(explored[p], size=min(per_prompt,
                                                                              explored[p]),
                                                       replace=False)))
            for p in chosen]


@dataclass(frozen=True)
class FidelityDecision:
    iteration: int
    tau: float | None
    rolling_tau: float | None
    state: str
    changed: bool
    reason: str


class RankFidelityMonitor:
    """Rolling τ in, trust/fallback out, with hysteresis so it does not flap."""

    def __init__(self, config: FidelityConfig) -> None:
        self.config = config
        self.state = TRUSTING
        self.taus: list[float | None] = []
        self.history: list[FidelityDecision] = []

    def rolling(self) -> tuple[float | None, int]:
        window = [t for t in self.taus[-self.config.window:] if t is not None]
        return (float(np.mean(window)) if window else None), len(window)

    def observe(self, iteration: int, tau: float | None) -> FidelityDecision:
        cfg = self.config
        tau = None if tau is None or math.isnan(tau) else float(tau)
        self.taus.append(tau)
        rolling, n = self.rolling()
        before = self.state
        reason = "no change"
        if n >= cfg.min_iterations and rolling is not None:
            if self.state == TRUSTING and rolling < cfg.floor:
                self.state = FALLBACK
                reason = (f"rolling Kendall tau {rolling:.2f} < floor {cfg.floor:.2f} over the "
                          f"last {n} iterations: falling back to {cfg.fallback} seeds")
            elif self.state == FALLBACK and rolling >= cfg.floor + cfg.recover_margin:
                self.state = TRUSTING
                reason = (f"rolling Kendall tau {rolling:.2f} >= "
                          f"{cfg.floor + cfg.recover_margin:.2f}: stale exploration trusted again")
        decision = FidelityDecision(iteration, tau, rolling, self.state, self.state != before,
                                    reason)
        self.history.append(decision)
        return decision

    def to_dict(self) -> dict:
        return {"state": self.state, "taus": self.taus,
                "history": [asdict(d) for d in self.history[-200:]]}

    @classmethod
    def from_dict(cls, config: FidelityConfig, data: dict) -> "RankFidelityMonitor":
        monitor = cls(config)
        monitor.state = data["state"]
        monitor.taus = list(data["taus"])
        monitor.history = [FidelityDecision(**d) for d in data.get("history", [])]
        return monitor
