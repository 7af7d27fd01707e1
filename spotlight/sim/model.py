"""The simulator's arithmetic: how long work takes and how much an iteration teaches.

Small pure functions, each checked by hand in the tests; the event loop only calls them.
"""
from __future__ import annotations

import math

from spotlight.sim.config import TimingConfig


def step_seconds(timing: TimingConfig, batch: int) -> float:
    """One denoising step of ``batch`` images on one SP group."""
    return timing.step_s * batch ** timing.batch_exponent / timing.sp_speedup


def request_seconds(timing: TimingConfig, batch: int, steps: int, resume_step: int = 0) -> float:
    """A request of ``batch`` images over ``steps`` steps, from its committed ``resume_step``
    (a resumed request first reads its latent back)."""
    left = max(steps - resume_step, 0)
    return left * step_seconds(timing, batch) + (timing.resume_s if resume_step > 0 else 0.0)


def train_seconds(timing: TimingConfig, images: int, gpus: int) -> float:
    """Training on ``images`` rollout images, data-parallel over ``gpus``."""
    return timing.train_s_per_image * images / max(gpus, 1)


def comm_init_seconds(timing: TimingConfig, ranks: int) -> float:
    """A communicator built from scratch (NCCL init grows with the ranks); none for one GPU."""
    return timing.comm_init_s_per_rank * ranks if ranks > 1 else 0.0


def spread_ratio(candidates: int, group_size: int, per_log: float) -> float:
    """Reward spread of the groups selected from ``candidates`` seeds over random groups'."""
    if candidates <= group_size:
        return 1.0
    return 1.0 + per_log * math.log(candidates / group_size)


def exploration_quality(explored_prompts: int, prompts: int, candidates: int, group_size: int,
                        reference_candidates: int) -> float:
    """How much of the reference exploration an iteration got, in [0, 1]: the share of its
    prompts that were explored, times the log-spread of their N against the reference N's
    (more than the reference is not counted: it was never measured)."""
    if prompts <= 0 or explored_prompts <= 0 or candidates <= group_size:
        return 0.0
    depth = math.log(candidates / group_size) / math.log(reference_candidates / group_size)
    return min(explored_prompts / prompts, 1.0) * min(depth, 1.0)


def iteration_progress(ratio: float, quality: float) -> float:
    """An iteration's progress to the target, in on-demand iterations: 1 without exploration,
    ``ratio`` with the reference exploration, linear in between."""
    return 1.0 + (ratio - 1.0) * quality


def iterations_to_target(progress: list[float], needed: float) -> int | None:
    """The iteration count at which the progress adds up to ``needed``; None if it never does."""
    total = 0.0
    for k, p in enumerate(progress, start=1):
        total += p
        if total >= needed - 1e-9:
            return k
    return None


def pipelined_split(timing: TimingConfig, gpus: int, images: int, rollout_gpu_s: float) -> int:
    """GPUs of the rollout pool in one-step off-policy pipelining (the rest train): the split
    whose slower side is fastest. ``rollout_gpu_s``: the rollout's work in GPU-seconds."""
    degree = timing.sp_degree
    best, best_s = degree, math.inf
    for rollout in range(degree, gpus, degree):
        slower = max(rollout_gpu_s / rollout, train_seconds(timing, images, gpus - rollout))
        if slower < best_s - 1e-12:
            best, best_s = rollout, slower
    return best
