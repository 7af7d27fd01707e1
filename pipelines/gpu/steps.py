"""The steps parts: one rollout denoising step and one LoRA training step of a transformer,
timed and with their peak memory, next to what the sizing model predicts.

At size ``real`` the transformer is at its published configuration with random weights born in
bfloat16 on the device -- nothing is downloaded (:mod:`.step_models`): Qwen-Image's
(``steps``: 20.4 B parameters, at 512² and 1280² with the settings of
``configs/qwen-image-512.yaml`` and ``qwen-image-1280.yaml``) and SD3.5-Medium's
(``steps_sd35``: at 512² and 1024² with ``configs/sd35-medium-ocr.yaml``'s) -- rollout batch,
true CFG, LoRA rank, gradient checkpointing, micro batch. At size ``tiny`` the same code runs
the tiny components at 32² and 64² (the CPU test).

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

from pipelines.front.dry_run import estimates
from pipelines.gpu.record import STEP_KEYS, Record, ratio
from pipelines.gpu.step_models import MODELS, StepModel, build_policy
from spotlight.config import PROJECT_ROOT, RunConfig, load_config
from spotlight.models.base import model_size
from spotlight.models.prompts import Prompt
from spotlight.rl.grpo import Advantages
from spotlight.rl.noise import SampleKey
from spotlight.rl.sampler import Trajectory, sample
from spotlight.rl.sde import sigma_schedule
from spotlight.rl.trainer import FlowGRPO, Rollout
from spotlight.sizing import GIB, iteration_estimates

ROLLOUT_STEPS = 3      # timed denoising steps (after one untimed)
PROMPT = "check-gpu"
QWEN = MODELS["qwen-image"]


def scale_config(size: str, scale: str, device: str, model: StepModel = QWEN) -> RunConfig:
    """The run config a scale is measured with: a named scale's own, or for a ``SIDExBATCH``
    shape the first scale's settings at that side, with rollout batch and micro-batch BATCH."""
    overrides = {"model.device": device}
    if "x" in scale:
        side, batch = (int(v) for v in scale.split("x"))
        return scale_config(size, model.scales(size)[0], device, model).with_values({
            "model.height": side, "model.width": side, "grpo.group_size": batch,
            "grpo.request_prompts": 1, "grpo.micro_batch": batch})
    if size == "real":
        path, side = model.real[scale]
        return load_config(PROJECT_ROOT / "configs" / path,
                           {**overrides, "model.height": side, "model.width": side})
    side = model.tiny[scale]
    return load_config(PROJECT_ROOT / "configs" / model.tiny_config,
                       {**overrides, "model.height": side, "model.width": side,
                        "model.gradient_checkpointing": True})


def resized(policy, height: int, width: int):
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


def measure_rollout(policy, config: RunConfig) -> dict:
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


def measure_train(policy, config: RunConfig) -> dict:
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


def run_steps(record: Record, size: str, device: str, shapes: tuple[str, ...] = (),
              model: StepModel = QWEN) -> None:
    """Build ``model``'s transformer once, then measure each scale's rollout and training step,
    and each extra ``SIDExBATCH`` shape's, writing each figure as soon as it is measured."""
    scales = model.scales(size) + tuple(shapes)
    configs = {scale: scale_config(size, scale, device, model) for scale in scales}
    sizes = {scale: model_size(configs[scale]) for scale in scales}
    first = configs[scales[0]]
    start = time.time()
    policy = build_policy(model, size, first, sizes[scales[0]].text_tokens)
    sync(policy.device)
    record.update(f"{model.section}.model", {
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
            record.update(f"{model.section}.{scale}.{kind}",
                          entry(measured, predicted[kind], config, size_of))
