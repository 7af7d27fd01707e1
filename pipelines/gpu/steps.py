"""The steps part: one rollout denoising step and one LoRA training step of the Qwen-Image
transformer, timed and with their peak memory, next to what the sizing model predicts.

At size ``real`` the transformer is diffusers' ``QwenImageTransformer2DModel`` at its published
configuration (20.4 B parameters) with random weights born in bfloat16 on the device -- nothing
is downloaded -- measured at 512² and 1280² with the settings of ``configs/qwen-image-512.yaml``
and ``qwen-image-1280.yaml`` (rollout batch, true CFG, LoRA rank, gradient checkpointing, micro
batch). At size ``tiny`` the same code runs the tiny components at 32² and 64² (the CPU test).

Both steps run through the policy and the trainer a run uses (:func:`spotlight.rl.sampler.
sample`, :meth:`spotlight.rl.trainer.FlowGRPO.train`). The predictions are the sizing model's
(:func:`spotlight.sizing.iteration_estimates`, what ``--dry-run`` prints) for one step of the
same shape; memory is the dry run's per-worker figure for the stage.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import resource
import time
from typing import Callable

import numpy as np
import torch
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

from pipelines.front.dry_run import estimates
from pipelines.gpu.record import SCALES, SHAPE_BASE, STEP_KEYS, Record, ratio
from spotlight.config import PROJECT_ROOT, RunConfig, load_config
from spotlight.models.base import model_size
from spotlight.models.prompts import Prompt
from spotlight.models.qwen_image.policy import QwenImagePolicy, placement_dtype
from spotlight.models.qwen_image.tiny import build_transformer, build_vae
from spotlight.models.qwen_image.weights import Components
from spotlight.rl.grpo import Advantages
from spotlight.rl.noise import SampleKey
from spotlight.rl.sampler import Trajectory, sample
from spotlight.rl.sde import sigma_schedule
from spotlight.rl.trainer import FlowGRPO, Rollout
from spotlight.sizing import GIB, iteration_estimates

CONFIGS = {"512": "qwen-image-512.yaml", "1280": "qwen-image-1280.yaml"}
TINY_SIDE = {"32": 32, "64": 64}
ROLLOUT_STEPS = 3      # timed denoising steps (after one untimed)
PROMPT = "check-gpu"


def scale_config(size: str, scale: str, device: str) -> RunConfig:
    """The run config a scale is measured with: a named scale's own, or for a ``SIDExBATCH``
    shape the first scale's settings at that side, with rollout batch and micro-batch BATCH."""
    overrides = {"model.device": device}
    if "x" in scale:
        side, batch = (int(v) for v in scale.split("x"))
        return scale_config(size, SHAPE_BASE[size], device).with_values({
            "model.height": side, "model.width": side, "grpo.group_size": batch,
            "grpo.request_prompts": 1, "grpo.micro_batch": batch})
    if size == "real":
        return load_config(PROJECT_ROOT / "configs" / CONFIGS[scale], overrides)
    side = TINY_SIDE[scale]
    return load_config(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml",
                       {**overrides, "model.height": side, "model.width": side,
                        "model.gradient_checkpointing": True})


def build_components(size: str, device: torch.device, dtype: torch.dtype) -> Components:
    """Random transformer and VAE, created on ``device`` in ``dtype`` (a float32 copy of the
    real transformer would not fit the GPU on its way to bfloat16)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            if size == "real":
                transformer, vae = QwenImageTransformer2DModel(), AutoencoderKLQwenImage()
            else:
                transformer, vae = build_transformer(), build_vae()
    finally:
        torch.set_default_dtype(previous)
    return Components(transformer=transformer.eval(), vae=vae.eval(), folder=PROJECT_ROOT,
                      dtype=dtype)


def build_policy(size: str, config: RunConfig, text_tokens: int) -> QwenImagePolicy:
    """The policy of ``config`` over random components; every prompt's embedding is one random
    ``text_tokens``-token array (no text encoder)."""
    device = torch.device(config.model.device)
    components = build_components(size, device, placement_dtype(config.model.dtype, device))
    policy = QwenImagePolicy(components, config.model, config.model.height,
                             config.model.width, device=device)
    width = components.transformer.config.joint_attention_dim
    embedding = np.random.default_rng(0).standard_normal((text_tokens, width)).astype(np.float32)
    policy.use_prompt_store(lambda prompt: embedding)
    return policy


def resized(policy: QwenImagePolicy, height: int, width: int) -> QwenImagePolicy:
    """The same modules at another resolution (the adapter is added once)."""
    out = copy.copy(policy)
    out.height, out.width, out._sigmas = height, width, {}
    return out


def rollout_batch(config: RunConfig) -> int:
    grpo = config.grpo
    return max(1, min(grpo.prompts_per_iteration * grpo.group_size,
                      grpo.group_size * grpo.request_prompts))


def predictions(config: RunConfig, size) -> dict:
    """The sizing model's seconds of one rollout step (one request's batch) and of one trained
    step of one micro-batch, and the dry run's memory per gpu worker for each stage."""
    cfg, grpo = config.model.true_cfg > 1.0, config.grpo
    one = iteration_estimates(
        size, prompts=1, group=rollout_batch(config), request_prompts=1, steps=1, cfg=cfg,
        candidates=1, explore_steps=1, explore_batch=1, micro_batch=grpo.micro_batch,
        trained_steps=1, gpu_workers=1, spot_workers=0,
        checkpointing=config.model.gradient_checkpointing, reference=grpo.beta_kl > 0)
    train_one = iteration_estimates(
        size, prompts=1, group=grpo.micro_batch, request_prompts=1, steps=1, cfg=cfg,
        candidates=1, explore_steps=1, explore_batch=1, micro_batch=grpo.micro_batch,
        trained_steps=1, gpu_workers=1, spot_workers=0,
        checkpointing=config.model.gradient_checkpointing, reference=grpo.beta_kl > 0)
    dry = {r.stage: r for r in estimates(config, size)}
    return {"rollout": (one[0].seconds, dry["rollout"].memory_gib),
            "train": (train_one[2].seconds, dry["train"].memory_gib)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    """The device's peak allocated memory since the last reset; on the CPU the process's peak
    resident size (never reset: an upper bound)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def measure_rollout(policy: QwenImagePolicy, config: RunConfig) -> dict:
    """Seconds per SDE denoising step of one rollout request's batch, and peak memory."""
    batch = rollout_batch(config)
    keys = [SampleKey(0, 0, seed) for seed in range(batch)]
    policy.eval()   # as a rollout worker's (a training step cut short may have left it training)

    def run(steps: int) -> Trajectory:
        sampler = dataclasses.replace(config.sampler, num_steps=steps, sde_window_start=0,
                                      sde_window_size=steps, schedule="shift")
        return sample(policy, [PROMPT] * batch, keys, sampler, mode="sde")

    return timed(policy.device, lambda: run(1), lambda: run(ROLLOUT_STEPS), ROLLOUT_STEPS,
                 batch=batch)


def measure_train(policy: QwenImagePolicy, config: RunConfig) -> dict:
    """Seconds per trained step of one micro-batch -- forward and backward (with gradient
    checkpointing as configured), the KL reference's forward, the optimizer step -- and peak
    memory, through :meth:`FlowGRPO.train` on a random trajectory."""
    batch, sampler = config.grpo.micro_batch, config.sampler
    trainer = FlowGRPO(config, policy, reward_fn=None, check_rewards=None)
    shape = (batch, sampler.num_steps + 1, *policy.tokens_shape)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(policy.device)
    trajectory = Trajectory(latents, torch.zeros(batch, sampler.num_steps, device=policy.device),
                            sigma_schedule(sampler.num_steps, sampler.shift),
                            list(range(sampler.sde_window_start, sampler.sde_window_end)))
    rollout = Rollout([Prompt(PROMPT, "ocr")] * batch, [], trajectory, np.empty(0),
                      np.zeros((1, batch)))
    advantages = Advantages(np.random.default_rng(2).standard_normal((1, batch)),
                            np.array([True]), np.ones(1))
    steps = len(trainer.trained_steps(rollout, 0))
    result = timed(policy.device, lambda: trainer.train(rollout, advantages, 0),
                   lambda: trainer.train(rollout, advantages, 0), steps, batch=batch)
    for p in trainer.parameters:   # a rollout worker holds no gradients: the next scale's
        p.grad = None              # rollout is measured without them
    return result                  # (the trainer, its optimizer state with it, goes here)


def timed(device: torch.device, warm_up: Callable, measured: Callable, units: int,
          **info) -> dict:
    """Run ``warm_up`` (kernel choice, workspaces, optimizer state), then time ``measured``:
    seconds per unit of it and the peak memory during it. Out of memory is a result."""
    try:
        warm_up()
        sync(device)
        reset_peak(device)
        start = time.perf_counter()
        measured()
        sync(device)
        return {"seconds": (time.perf_counter() - start) / units, "peak_gib": peak_gib(device),
                "units": units, **info}
    except torch.OutOfMemoryError as err:
        return {"seconds": None, "peak_gib": peak_gib(device), "oom": True,
                "error": str(err).splitlines()[0][:300], **info}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def entry(measured: dict, predicted: tuple[float, float], config: RunConfig, size) -> dict:
    """One step's record: measured, predicted and their ratios, every key present."""
    seconds, memory = predicted
    out = {"predicted_seconds": seconds, "predicted_gib": memory,
           "seconds_ratio": ratio(measured.get("seconds"), seconds),
           "memory_ratio": ratio(measured.get("peak_gib"), memory),
           "passes": 2 if config.model.true_cfg > 1.0 else 1, "image_tokens": size.image_tokens,
           **measured}
    return {k: out.get(k) for k in STEP_KEYS} | out


def run_steps(record: Record, size: str, device: str, shapes: tuple[str, ...] = ()) -> None:
    """Build the transformer once, then measure each scale's rollout and training step, and
    each extra ``SIDExBATCH`` shape's, writing each figure as soon as it is measured."""
    scales = SCALES[size] + tuple(shapes)
    configs = {scale: scale_config(size, scale, device) for scale in scales}
    sizes = {scale: model_size(configs[scale]) for scale in scales}
    first = configs[scales[0]]
    start = time.time()
    policy = build_policy(size, first, sizes[scales[0]].text_tokens)
    sync(policy.device)
    record.update("steps.model", {
        "transformer_params": sum(p.numel() for n, p in policy.transformer.named_parameters()
                                  if "lora_" not in n),
        "predicted_transformer_params": sizes[scales[0]].transformer,
        "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
        "predicted_trainable_params": sizes[scales[0]].trainable,
        "dtype": str(policy.components.dtype), "build_seconds": time.time() - start,
        "weights_gib": torch.cuda.memory_allocated(policy.device) / GIB
        if policy.device.type == "cuda" else None,
        "text_tokens": sizes[scales[0]].text_tokens})
    for scale in scales:
        config, size_of = configs[scale], sizes[scale]
        at = resized(policy, config.model.height, config.model.width)
        predicted = predictions(config, size_of)
        for kind, measure in (("rollout", measure_rollout), ("train", measure_train)):
            measured = measure(at, config)
            record.update(f"steps.{scale}.{kind}",
                          entry(measured, predicted[kind], config, size_of))
