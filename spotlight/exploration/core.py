"""Seed exploration without I/O: which candidates a prompt explores, how scored candidates
become the seeds an iteration rolls out, and how an audit compares stale with fresh scores.

Two runners drive it and must agree bit for bit: the Dask cluster
(:class:`pipelines.run.exploration.Exploration`: requests on spot workers, results in the run
store) and the in-process harness (:class:`pipelines.run.inprocess.InProcessRun`: the same task
functions called in order). Everything that decides a number lives here, once; the runners
only move requests and results.

An iteration's exploration, in order:

1. :func:`candidate_seeds` -- the N candidates of each prompt, cut into requests of
   ``exploration.request_batch`` (:func:`request_chunks`);
2. the requests are scored (a runner's job) and :func:`gather`-ed into :data:`PerPrompt`;
3. :func:`selection_of` -- the G seeds per prompt the rollout uses, from the source
   :func:`~spotlight.exploration.selection.seed_source` chose;
4. every ``fidelity.audit_every`` iterations, :func:`audit_candidates` re-scored with fresh
   weights at :func:`audit_steps`, and :func:`audit_tau` says whether stale still ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from spotlight.exploration.fidelity import audit_picks, grouped_kendall_tau
from spotlight.exploration.planner import Plan
from spotlight.exploration.selection import Selection, select_seeds
from spotlight.rl.trainer import random_seeds

PerPrompt = list[tuple[list[int], list[float]]]
"""Per prompt of an iteration: the candidate seeds explored and their scores, in seed order."""

CANDIDATE_STREAM = 7919
"""Offset of the candidates' seed stream from the rollouts' (``random_seeds``), so the
candidates of iteration k are not the seeds a vanilla run of k rolls out."""


@dataclass(frozen=True)
class Scored:
    """What one exploration request returned: ``rewards`` of ``seeds`` of prompt
    ``prompt_index``, the ``chunk``-th request of that prompt."""

    prompt_index: int
    chunk: int
    seeds: np.ndarray
    rewards: np.ndarray


def candidate_seeds(run_seed: int, iteration: int, prompts: int, candidates: int) -> np.ndarray:
    """The N candidate seeds of each prompt explored for ``iteration`` (deterministic)."""
    return random_seeds(run_seed + CANDIDATE_STREAM, iteration, prompts, candidates)


def request_chunks(candidates: int, batch: int) -> list[tuple[int, int]]:
    """(chunk, first candidate) of each request exploring one prompt's ``candidates``:
    fixed shapes of ``batch`` candidates, wherever they run."""
    return list(enumerate(range(0, candidates, batch)))


def gather(scored: Iterable[Scored], prompts: int) -> PerPrompt:
    """The scores of finished requests, per prompt in request order (a request that never
    finished -- the deadline, a lost spot worker -- leaves its candidates out)."""
    per_prompt: PerPrompt = [([], []) for _ in range(prompts)]
    for out in sorted(scored, key=lambda s: (s.prompt_index, s.chunk)):
        per_prompt[out.prompt_index][0].extend(np.asarray(out.seeds).tolist())
        per_prompt[out.prompt_index][1].extend(np.asarray(out.rewards).tolist())
    return per_prompt


def random_selection(run_seed: int, iteration: int, prompts: int, group: int) -> Selection:
    """Fresh random seeds for an iteration that did not explore."""
    seeds = random_seeds(run_seed, iteration, prompts, group)
    return Selection(seeds, np.zeros(len(seeds), int), np.zeros(len(seeds), int),
                     np.full(seeds.shape, np.nan))


def select(run_seed: int, iteration: int, per_prompt: PerPrompt, group: int,
           rule: str = "max-variance") -> Selection:
    """The ``group`` seeds per prompt chosen by ``rule`` among the scored candidates; a prompt
    with fewer than ``group`` scored fills up with fresh random seeds."""
    fresh = random_seeds(run_seed, iteration, len(per_prompt), group)
    return select_seeds([(np.asarray(s), np.asarray(r)) for s, r in per_prompt], group, fresh,
                        rule)


def first_drawn(per_prompt: PerPrompt, group: int) -> PerPrompt:
    """The fallback when stale rankings are not trusted: the first G candidates of each prompt,
    which were drawn at random, so choosing among them is a random choice."""
    return [(s[:group], r[:group]) for s, r in per_prompt]


def selection_of(source: str, run_seed: int, iteration: int, prompts: int, group: int,
                 candidates: PerPrompt | None, rule: str = "max-variance") -> Selection:
    """The seeds of ``iteration`` from ``source`` (``explore`` or ``sync``: chosen among
    ``candidates`` by ``rule``; ``fallback-random``: their first G; else random)."""
    if source in ("explore", "sync"):
        return select(run_seed, iteration, candidates, group, rule)
    if source == "fallback-random":
        return select(run_seed, iteration, first_drawn(candidates, group), group)
    return random_selection(run_seed, iteration, prompts, group)


def audit_candidates(run_seed: int, iteration: int, stale: PerPrompt, audit_prompts: int,
                     audit_candidates_per_prompt: int) -> list[tuple[int, np.ndarray]]:
    """(prompt index, seeds) of the stale candidates of ``iteration`` the audit re-scores
    with fresh weights: random prompts and random candidates of each."""
    picks = audit_picks(run_seed, iteration, [len(s) for s, _ in stale], audit_prompts,
                        audit_candidates_per_prompt)
    return [(p, np.asarray([stale[p][0][c] for c in chosen])) for p, chosen in picks]


def audit_steps(plan: Plan | None) -> int | None:
    """The audit replays as many steps as the stale exploration it judges did (the plan's M),
    so that it measures staleness and nothing else; None: the rollout's default."""
    return None if plan is None else plan.steps


@dataclass(frozen=True)
class Audit:
    """Stale against fresh scores of the audited candidates, per audited prompt."""

    stale: list[list[float]]
    fresh: list[list[float]]
    kendall_tau: float | None   # None when every ranking tied


def audit_tau(stale: PerPrompt, audited: Iterable[Scored]) -> Audit:
    """Kendall τ between the stale and the fresh ranking of each audited prompt, averaged."""
    xs, ys = [], []
    for out in audited:
        scored = dict(zip(stale[out.prompt_index][0], stale[out.prompt_index][1]))
        xs.append([scored[int(s)] for s in out.seeds])
        ys.append(np.asarray(out.rewards).tolist())
    tau = grouped_kendall_tau(xs, ys)
    return Audit(xs, ys, None if np.isnan(tau) else float(tau))
