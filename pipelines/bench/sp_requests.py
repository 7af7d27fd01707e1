"""Bench sp's requests: denoising a bare transformer on an SP group, and the one-process
reference a group must match. They run on the executors of :mod:`pipelines.parallel.executor`
like the pipeline's SP rollout requests, committing every step to a run store so a request cut
by a lost member resumes from its last committed step."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelines.parallel.executor import breaks_on_error, forward, state
from storage import RunStore


@dataclass(frozen=True)
class Denoised:
    """Rank 0's answer to a :func:`denoise` request."""

    latents: torch.Tensor
    resumed_from: int


def denoise(epoch: int, inputs: dict, steps: int, url: str | None = None,
            request: str | None = None) -> Denoised | None:
    """A request of ``steps`` Euler steps from ``inputs``' latents (sigma 1 -> 0), each step an
    SP forward; rank 0 returns the final ``latents`` and the step it ``resumed_from``. With a
    run store ``url``, rank 0 commits every step's latent under ``request`` (stage ``sp``),
    and a request that was cut off -- its group broken by a lost member -- resumes on whatever
    group runs it next from its last committed step."""
    st = state()
    rank = dist.get_rank()
    store = sink = None
    start, latents = 0, inputs["hidden_states"]
    if url is not None and rank == 0:
        store = RunStore.open(url, create=False)
        point = store.resume_point("sp", request)
        if point is not None:
            start, latents = point.step, torch.from_numpy(point.latent)
        sink = store.latent_sink("sp", commit_interval_s=0.0)
    begin = torch.tensor([start])
    with breaks_on_error():
        dist.broadcast(begin, src=0)   # where the request stands, for every member
        latents = latents.clone()
        dist.broadcast(latents, src=0)
    start = int(begin.item())
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    try:
        if sink is not None and start == 0:
            sink.commit(request, 0, latents.numpy(), num_steps=steps, weights_version=st.version)
        for k in range(start, steps):
            velocity = forward(epoch, {**inputs, "hidden_states": latents,
                                       "timestep": sigmas[k].reshape(1)})
            if rank == 0:
                latents = latents + (sigmas[k + 1] - sigmas[k]) * velocity
                if sink is not None:
                    sink.commit(request, k + 1, latents.numpy(), num_steps=steps,
                                weights_version=st.version)
            with breaks_on_error():
                dist.broadcast(latents, src=0)
    finally:
        if sink is not None:   # what was computed is kept, also when a peer is lost
            sink.close(raise_errors=False)
    return Denoised(latents, start) if rank == 0 else None


@torch.no_grad()
def denoise_alone(model, inputs: dict, steps: int) -> torch.Tensor:
    """What :func:`denoise` computes, in one process: the reference a group must match."""
    latents, sigmas = inputs["hidden_states"], torch.linspace(1.0, 0.0, steps + 1)
    for k in range(steps):
        velocity = model(**{**inputs, "hidden_states": latents,
                            "timestep": sigmas[k].reshape(1)}, return_dict=False)[0]
        latents = latents + (sigmas[k + 1] - sigmas[k]) * velocity
    return latents


def denoise_requests(inputs: dict, steps: int, url: str) -> dict:
    """Requests of :func:`denoise` for a :class:`~pipelines.parallel.serve.GroupServer`
    (name -> its function and arguments)."""
    return {name: (denoise, (x, steps, url, name)) for name, x in inputs.items()}
