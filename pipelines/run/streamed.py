"""One streamed request, the way every kind runs it: exploration's candidates, a pulled rollout
request and one member's share of an SP rollout request.

A streamed request SDE-samples a fixed batch, committing its latent to the run store after every
denoising step. An attempt that finds committed steps (an earlier attempt was killed or handed
back) resumes from the last one and recomputes the log-probabilities of the steps before it,
so the trajectory equals an uninterrupted one bit for bit. After a preemption notice it stops at
the next step boundary, once that step is committed, and returns :class:`HandedBack` instead of
failing.

:func:`run_streamed_request` is the skeleton the three request tasks share (the worker's lock,
the policy at the request's weights version, the hand-back); :func:`sample_streamed` is its step
loop. Every attempt carries its number (:class:`StreamedRequest.attempt`) into the run store,
which fences a stale attempt's writes out of the trajectory (:mod:`storage.attempts`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from pipelines.cluster.preemption import HandedBack, StopAtStep, check_notice
from pipelines.run.records import stage_name, task_record
from spotlight.config import RunConfig
from spotlight.models.base import Policy
from spotlight.rl.sampler import (
    Trajectory,
    initial_latents,
    sample,
    schedule_of,
    step_grid,
    transition_distribution,
)
from spotlight.rl.sde import gaussian_log_prob
from storage import RunStore
from storage.attempts import FIRST, Attempt
from storage.latents import Labels

T = TypeVar("T")


class WorkerContext(Protocol):
    """What a streamed request uses of its worker's context (:class:`pipelines.run.tasks.
    WorkerContext`, which imports this module)."""

    config: RunConfig
    store: RunStore
    policy: Policy
    lock: Any
    reward_fn: Callable

    def policy_at(self, version: int) -> Policy: ...


@dataclass(frozen=True)
class Explored:
    """A finished exploration request: the rewards of its candidate seeds of one prompt."""

    prompt_index: int
    chunk: int
    seeds: np.ndarray
    rewards: np.ndarray
    record: dict


@dataclass(frozen=True)
class RolledOut:
    """A finished rollout request (its latents and log-probabilities are in the run store):
    the step its last attempt resumed from, its record and the object its log-probabilities
    are in (each attempt writes its own)."""

    request: str
    resumed_from: int
    record: dict
    log_probs: str = ""


@dataclass(frozen=True)
class StreamedRequest:
    """One attempt of a request of stage ``kind`` (``explore``, ``rollout``, ...) of
    ``iteration``: its name in the stage, the weights version it samples with and the attempt
    number the driver gave it (its fencing token in the run store, :mod:`storage.attempts`)."""

    name: str
    version: int
    kind: str
    iteration: int
    attempt: Attempt = FIRST

    def as_attempt(self, attempt) -> "StreamedRequest":
        """This request as ``attempt`` (an :class:`Attempt` or its pair, as Dask sends it)."""
        return dataclasses.replace(self, attempt=Attempt(*attempt))

    @property
    def stage(self) -> str:
        """The stage folder its latents stream to (``iter-3/explore``)."""
        return stage_name(self.iteration, self.kind)


@dataclass
class RequestRun:
    """One attempt of a streamed request, as its body sees it."""

    ctx: WorkerContext
    request: StreamedRequest
    policy: Policy
    start: float = field(default_factory=time.time)
    # Where the attempt resumed from and when its first and last new steps were committed
    # (filled by sample_streamed; it goes into every record of the attempt).
    progress: dict = field(default_factory=dict)

    def record(self, **info: Any) -> dict:
        r = self.request
        return task_record(r.kind, r.iteration, self.start, r.version, request=r.name,
                           attempt=r.attempt.key, **info, **self.progress)

    def sample(self, prompts: list[str], seeds: np.ndarray, keys, num_steps: int | None = None,
               member=None) -> Trajectory:
        """Sample the request, preemptible at step boundaries (an SP group's ``member`` is
        not: its group stops together only when it breaks)."""
        return sample_streamed(self.ctx, prompts, seeds, keys, self.request,
                               num_steps=num_steps, progress=self.progress, member=member)


def run_streamed_request(ctx: WorkerContext, request: StreamedRequest,
                         body: Callable[[RequestRun], T],
                         around: Callable[[Policy], Any] = lambda policy: contextlib.nullcontext()
                         ) -> T | HandedBack:
    """Run ``body`` as one attempt of ``request`` on this worker: under the worker's lock (one
    request at a time per process), with the policy at the request's weights version in eval
    mode, inside ``around(policy)`` (an SP group's sequence-parallel wrap). A notice that stops
    it at a step boundary returns :class:`HandedBack` with the step the store committed."""
    with ctx.lock:
        policy = ctx.policy_at(request.version)
        policy.eval()
        run = RequestRun(ctx, request, policy)
        try:
            with around(policy):
                return body(run)
        except StopAtStep as stop:
            # The sink has closed: everything through stop.step is committed.
            point = ctx.store.resume_point(request.stage, request.name)
            return HandedBack(request.name, 0 if point is None else int(point.step), stop.step,
                              run.record(preempted=True))


def sample_streamed(ctx: WorkerContext, prompts: list[str], seeds: np.ndarray, keys,
                    request: StreamedRequest, num_steps: int | None = None,
                    progress: dict | None = None, member=None) -> Trajectory:
    """SDE-sample one request, committing the latent after every step when streaming is on.

    A request the store already holds steps of resumes from its last committed step; the steps
    before it are read back and their log-probabilities recomputed.

    With ``progress`` (a dict) the request is preemptible: after a notice it stops at the next
    step boundary with :class:`StopAtStep`, once that step is committed; ``progress`` says
    where it resumed from and when its first and last new steps were committed
    (``first_step``: the step committed at ``first_step_at``).

    With ``member`` (:class:`~pipelines.parallel.executor.GroupMember`) this is one member of
    an SP group running the same request: every member computes the same steps, the leader
    alone reads where the request stands (the others take its answer) and commits.
    """
    config, stage, name, version = ctx.config, request.stage, request.name, request.version
    steps = num_steps or config.sampler.num_steps
    if not config.stream_latents:
        return sample(ctx.policy, prompts, keys, config.sampler, mode="sde", num_steps=steps)
    leads = member is None or member.leads
    point = resume_point(ctx.store, stage, name, version, member)
    start = 0 if point is None else point.step
    if progress is not None:
        progress.update(resumed_from=start, first_step_at=None)
        if member is None:   # a group's members stop together only when the group breaks
            check_notice(start)   # noticed before it began: hand it back untouched
    labels = latent_labels(config, prompts, seeds, steps, version, ctx.policy)
    with ctx.store.latent_sink(stage) if leads else contextlib.nullcontext() as sink:
        def commit(step: int, x: torch.Tensor) -> None:
            if sink is None:
                return
            # The tensor as it is (on the GPU too): the sink copies it to the host through
            # pinned memory without stalling this loop.
            sink.commit(name, step, x, num_steps=steps, weights_version=version,
                        labels=labels, attempt=request.attempt)
            if progress is not None and step > 0:
                progress["last_step_at"] = time.time()
                if progress["first_step_at"] is None:
                    progress["first_step_at"] = progress["last_step_at"]
                    progress["first_step"] = step
                if step < steps and member is None:
                    check_notice(step)   # the latent is queued; the sink's exit commits it

        if point is None:
            commit(0, initial_latents(keys, ctx.policy.tokens_shape))
        traj = sample(ctx.policy, prompts, keys, config.sampler, mode="sde", num_steps=steps,
                      start_step=start, start_latents=None if point is None
                      else torch.from_numpy(np.asarray(point.latent)),
                      on_step=lambda t, x: commit(t + 1, x))
    if start > 0:
        earlier = np.asarray(ctx.store.latents.read_steps(stage, name, 0, start))
        traj.latents[:, :start] = torch.from_numpy(earlier).transpose(0, 1)
        recompute_log_probs(ctx.policy, traj, prompts, config, start, steps)
    return traj


def resume_point(store: RunStore, stage: str, request: str, version: int, member):
    """The request's last committed step (None: none), read by the group's leader alone and
    agreed on by its other members; a step of another weights version is an error."""
    leads = member is None or member.leads
    point = store.resume_point(stage, request) if leads else None
    point = point if member is None else member.agree(point)
    if point is not None and point.weights_version != version:
        raise RuntimeError(f"{stage}/{request} was started with weights version "
                           f"{point.weights_version}, now asked for {version}")
    return point


def latent_labels(config: RunConfig, prompts: list[str], seeds: np.ndarray, steps: int,
                  version: int, policy: Policy) -> Labels:
    """What a stored request's latents are: per sample its prompt and seed, per step its σ."""
    return Labels(("sample", "token", "channel"), {
        "prompt": ("sample", list(prompts)), "seed": ("sample", np.asarray(seeds).reshape(-1)),
        "sigma": ("step", step_grid(config.sampler, steps, schedule=schedule_of(
            policy, config.sampler)).sigmas.double().numpy()),
        "weights_version": ("", np.int64(version))})


@torch.no_grad()
def recompute_log_probs(policy, traj: Trajectory, prompts: list[str], config: RunConfig,
                        stop: int, steps: int) -> None:
    """Fill the log-probabilities of the SDE steps before ``stop`` from the stored latents."""
    sampler = config.sampler
    if steps != sampler.num_steps:
        return   # exploration replays use no log-probabilities
    text = policy.encode(prompts)
    for t in traj.trainable_steps:
        if t < stop:
            dist = transition_distribution(policy, traj.latents, t, traj.sigmas, text, sampler)
            traj.log_probs[:, t] = gaussian_log_prob(traj.latents[:, t + 1], dist)
