"""Seed selection: pure functions over explored (seed, reward) candidates.

By default the G most spread of N (max variance); ``exploration.selection`` also offers the G
best, and G at evenly spaced ranks.

Choosing G of N values to maximise their variance has an exact, cheap answer: an optimal
subset is always the j lowest plus the G - j highest values for some j (moving any chosen
value towards the middle can only shrink the spread), so trying every j is exhaustive.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spotlight.modes import mode_of


def max_variance_subset(rewards: np.ndarray, seeds: np.ndarray, size: int) -> np.ndarray:
    """Indices of ``size`` candidates with the largest reward variance.

    Ties are broken deterministically: candidates are ordered by (reward, seed), and among
    equally good splits the one with the fewest low values wins.
    """
    rewards, seeds = np.asarray(rewards, dtype=np.float64), np.asarray(seeds)
    if rewards.shape != seeds.shape or rewards.ndim != 1:
        raise ValueError(f"rewards {rewards.shape} and seeds {seeds.shape} must be equal 1-d "
                         "shapes")
    if not 1 <= size <= len(rewards):
        raise ValueError(f"cannot choose {size} of {len(rewards)} candidates")
    order = np.lexsort((seeds, rewards))
    best, best_var = None, -1.0
    for low in range(size + 1):
        chosen = np.concatenate([order[:low], order[len(order) - (size - low):]])
        var = float(np.var(rewards[chosen]))
        if var > best_var + 1e-12:
            best, best_var = chosen, var
    return np.sort(best)


def top_subset(rewards: np.ndarray, seeds: np.ndarray, size: int) -> np.ndarray:
    """Indices of the ``size`` best-rewarded candidates (ties: the larger seed wins): the group
    contrasts good samples with each other, and every one is worth imitating."""
    order = np.lexsort((np.asarray(seeds), np.asarray(rewards, dtype=np.float64)))
    return np.sort(order[len(order) - size:])


def quantile_subset(rewards: np.ndarray, seeds: np.ndarray, size: int) -> np.ndarray:
    """Indices of ``size`` candidates at evenly spaced ranks, the worst and the best included:
    the group spans the whole range with its middle, so its advantages are graded rather than
    split into two lumps (what an advantage-weighted objective weighs by)."""
    order = np.lexsort((np.asarray(seeds), np.asarray(rewards, dtype=np.float64)))
    ranks = np.round(np.linspace(0, len(order) - 1, size)).astype(int)
    return np.sort(order[ranks])


# exploration.selection -> the rule; the names are the config's (spotlight.config.sections).
SUBSET_RULES = {"max-variance": max_variance_subset, "top": top_subset,
                "quantiles": quantile_subset}


def random_group_std(rewards_per_prompt, group: int) -> float:
    """The mean within-prompt reward std of ``group`` seeds taken as they come (the first
    ``group`` candidates of each prompt): what random seeds would have given, the planner's
    baseline for the spread a selection buys."""
    return float(np.mean([np.std(r[:group]) for r in rewards_per_prompt if len(r) >= 2]
                         or [0.0]))


def fill_seeds(chosen: np.ndarray, size: int, fresh: np.ndarray) -> tuple[np.ndarray, int]:
    """Top up ``chosen`` seeds to ``size`` from ``fresh`` ones (skipping duplicates).

    Returns the seeds and how many were filled in.
    """
    out = [int(s) for s in chosen]
    filled = 0
    for s in fresh:
        if len(out) >= size:
            break
        if int(s) not in out:
            out.append(int(s))
            filled += 1
    if len(out) < size:
        raise ValueError(f"need {size} seeds, have {len(out)} after filling; pass more fresh seeds")
    return np.asarray(out, dtype=np.int64), filled


@dataclass(frozen=True)
class Selection:
    """The seeds chosen for each prompt of one iteration, and how they were chosen."""

    seeds: np.ndarray               # (P, G)
    explored: np.ndarray            # (P,) finished candidates per prompt
    filled: np.ndarray              # (P,) random seeds added because too few finished
    selected_rewards: np.ndarray    # (P, G) exploration reward of each chosen seed (nan if filled)

    def to_record(self) -> dict:
        return {"seeds": self.seeds.tolist(), "explored": self.explored.tolist(),
                "filled": self.filled.tolist(),
                "selected_rewards": np.where(np.isnan(self.selected_rewards), None,
                                             self.selected_rewards).tolist()}

    @classmethod
    def from_record(cls, record: dict) -> "Selection":
        rewards = np.array([[np.nan if r is None else r for r in row]
                            for row in record["selected_rewards"]], dtype=np.float64)
        return cls(np.asarray(record["seeds"], dtype=np.int64), np.asarray(record["explored"]),
                   np.asarray(record["filled"]), rewards)


def select_seeds(candidates: list[tuple[np.ndarray, np.ndarray]], group: int,
                 fresh: np.ndarray, rule: str = "max-variance") -> Selection:
    """Per prompt: ``group`` of its finished (seeds, rewards) by ``rule`` (:data:`SUBSET_RULES`;
    the most spread by default), topped up from ``fresh`` (P, >= group) random seeds when fewer
    than ``group`` finished."""
    subset = SUBSET_RULES[rule]
    seeds_out, explored, filled, rewards_out = [], [], [], []
    for p, (seeds, rewards) in enumerate(candidates):
        seeds, rewards = np.asarray(seeds, dtype=np.int64), np.asarray(rewards, dtype=np.float64)
        explored.append(len(seeds))
        if len(seeds) >= group:
            idx = subset(rewards, seeds, group)
            seeds_out.append(seeds[idx])
            rewards_out.append(rewards[idx])
            filled.append(0)
            continue
        row, n = fill_seeds(seeds, group, fresh[p])
        seeds_out.append(row)
        rewards_out.append(np.concatenate([rewards, np.full(n, np.nan)]))
        filled.append(n)
    return Selection(np.stack(seeds_out), np.asarray(explored), np.asarray(filled),
                     np.stack(rewards_out))


def seed_source(mode: str, trusting: bool, fallback: str, has_stale: bool) -> str:
    """Where an iteration's seeds come from, given the run ``mode``, whether the fidelity
    monitor still trusts stale rankings, its ``fallback`` ('sync' or 'random') and whether
    candidates scored with the previous weights exist: 'sync' (explore with the current
    weights now), 'explore' (select among the stale candidates), 'fallback-random' (their
    first G seeds, which were drawn at random: the stale scores kept for τ, not used) or
    'random'. One rule for the pipeline and the harness, so the two cannot drift apart."""
    mode_ = mode_of(mode)
    falling_back = mode_.stale and not trusting
    if (mode_.explores and not mode_.stale) or (falling_back and fallback == "sync"):
        return "sync"
    if mode_.stale and has_stale:
        return "fallback-random" if falling_back else "explore"
    return "random"
