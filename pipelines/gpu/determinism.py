"""The determinism part: what the device really does when a request is computed again.

Spotlight's fencing and resume design assumes a request's trajectory is a function of its seeds
and weights: run twice, or resumed from a committed step (the later steps sampled from the
stored latent, the earlier log-probabilities recomputed), it gives the same numbers. This part
measures how far that holds -- the largest difference of latents and log-probabilities -- with
torch's default kernels and with ``torch.use_deterministic_algorithms(True)``, on the steps
part's model (the real transformer at 512² at size ``real``, the tiny one at ``tiny``).
"""
from __future__ import annotations

import warnings

import torch

from pipelines.gpu.record import SCALES, Record
from pipelines.gpu.step_models import build_policy
from pipelines.gpu.steps import QWEN, scale_config
from pipelines.run.streamed import recompute_log_probs
from spotlight.models.base import model_size
from spotlight.rl.noise import SampleKey
from spotlight.rl.sampler import Trajectory, sample

STEPS, RESUME_AT, BATCH = 4, 2, 2
PROMPTS = ['a sign that says "59"', "a poster"]


def run_determinism(record: Record, size: str, device: str) -> None:
    config = scale_config(size, SCALES[size][0], device).with_values({
        "sampler.num_steps": STEPS, "sampler.sde_window_start": 0,
        "sampler.sde_window_size": STEPS, "sampler.schedule": "shift"})
    policy = build_policy(QWEN, size, config, model_size(config).text_tokens)
    keys = [SampleKey(0, 1, seed) for seed in range(BATCH)]
    record.update("determinism.setup", {"steps": STEPS, "resume_at": RESUME_AT, "batch": BATCH,
                                        "height": config.model.height,
                                        "true_cfg": config.model.true_cfg})
    firsts = {}
    for mode in ("default", "deterministic"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.use_deterministic_algorithms(mode == "deterministic", warn_only=True)
            try:
                first, again, resumed = runs(policy, config, keys)
            finally:
                torch.use_deterministic_algorithms(False)
        firsts[mode] = first
        record.update(f"determinism.{mode}", {
            "rerun": compare(first, again), "resume": compare(first, resumed),
            "warnings": sorted({str(w.message).splitlines()[0][:200] for w in caught})})
    record.update("determinism.across_modes", compare(firsts["default"],
                                                      firsts["deterministic"]))


def runs(policy, config, keys) -> tuple[Trajectory, Trajectory, Trajectory]:
    """The request, again, and resumed at :data:`RESUME_AT` from the first one's latent there
    (its earlier log-probabilities recomputed, as a resumed streamed request does)."""
    prompts = PROMPTS[:len(keys)]
    first = sample(policy, prompts, keys, config.sampler, mode="sde")
    again = sample(policy, prompts, keys, config.sampler, mode="sde")
    resumed = sample(policy, prompts, keys, config.sampler, mode="sde", start_step=RESUME_AT,
                     start_latents=first.latents[:, RESUME_AT].cpu())
    resumed.latents[:, :RESUME_AT] = first.latents[:, :RESUME_AT]
    recompute_log_probs(policy, resumed, prompts, config, RESUME_AT, STEPS)
    return first, again, resumed


def compare(a: Trajectory, b: Trajectory) -> dict:
    return {"equal": bool(torch.equal(a.latents, b.latents)
                          and torch.equal(a.log_probs, b.log_probs)),
            "max_abs_diff_latents": float((a.latents - b.latents).abs().max()),
            "max_abs_diff_log_probs": float((a.log_probs - b.log_probs).abs().max())}
