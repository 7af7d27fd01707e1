"""Size a run before paying for it: memory per worker and time and cost per iteration.

Pure arithmetic on a config, the model's parameter counts and measured timings -- nothing is
loaded or run. Every estimate says how it is computed (``Estimate.how``), so a user can judge
it; ``spotlight run --dry-run`` prints them.

Timing model, measured by ``spotlight check-gpu`` on one H200 (2026-11-28, diffusers'
``QwenImageTransformer2DModel`` at 20.4 B, bf16, eager; ``docs/data/check-gpu-h200-2026-11-28/``):
one transformer pass over ``b`` images of ``n`` image tokens takes
``T1 * (n / 1024) ** 0.965 * b`` seconds with T1 = 58.8 ms. The pass is compute-bound already at
batch 1 for a 20 B model, so it is linear in the batch (measured 0.941 s at 512², b16; the
published H100 batch-1 figure, 116 ms per CFG step at 512² in vllm-omni, is the same 58 ms per
image); the token exponent joins the measured 512² and 1280² rollout steps (attention's square
term shows). A LoRA training step (forward + backward, the frozen weights get no gradient) costs
2.4 forwards (measured 2.29 at 512², 2.49 at 1280²); full fine-tuning 3, the textbook figure.
Other GPUs: scale by ``gpu_speed``.

Other transformers (SD3.5-Medium) are predicted from the same measurement, scaled by their work
per pass against the measured one's at the same image tokens (:func:`work_scale`): matmul FLOPs
(2 x parameters x joint tokens) plus attention's (4 x layers x width x joint tokens²), where the
joint sequence is the image tokens and the prompt tokens the transformer attends to (SD3.5
always 333: CLIP's 77 and T5's 256, padded). This assumes the measured efficiency carries over;
a narrower model runs its matmuls less efficiently at small batches, so expect it to be slower
than predicted at batch 1 and closer at the rollout's batches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

FORWARD_1024_S = 0.0588    # s per image per pass at 1024 tokens: H200 check, 0.941 s / 16 images
TOKEN_EXPONENT = 0.965     # log(5.518 s / 0.941 s) / log(6400 / 1024): H200 check, b16 rollouts
BATCH_EXPONENT = 1.0       # compute-bound: 0.941 s at b16 = 16 x the published 58 ms at b1
TRAIN_FORWARDS = 3.0       # forward + backward of full fine-tuning: the textbook ~3 forwards
ADAPTER_TRAIN_FORWARDS = 2.4   # LoRA: no weight gradients for frozen weights (H200 check)
# Inference holds ~23 bytes-per-weight x tokens x width per image beyond the weights at its
# peak (attention and MLP intermediates of one block, both CFG passes' outputs): the H200 check,
# 21.0-23.9 over five shapes from 512² b16 to 1536² b2 (12, a count of the block's tensors,
# left the 1280² rollout 14% short).
INFERENCE_ACTIVATIONS = 23
# The transformer the timing was measured on: QwenImageTransformer2DModel at its published
# configuration, with 256 prompt tokens (the check's text embedding, ModelSize's default).
CALIBRATED_PARAMS = 20_430_401_088
CALIBRATED_LAYERS = 60
CALIBRATED_HIDDEN = 3072
CALIBRATED_TEXT_TOKENS = 256
GPU_MEMORY_GIB = 80.0      # an H100's memory: the dry run flags stages that need more
GIB = 1024 ** 3


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of a policy's parts and the bytes of one weight."""

    transformer: int
    vae: int
    text_encoder: int
    trainable: int              # adapter parameters, or the transformer's for full tuning
    weight_bytes: int           # 2 for bf16/fp16, 4 for fp32
    hidden: int                 # transformer width (activations per token)
    layers: int
    latent_channels: int        # packed latent channels per token
    image_tokens: int           # packed latent tokens per image at the run's resolution
    text_tokens: int = 256      # prompt tokens in the joint sequence (activations, work)


@dataclass(frozen=True)
class Estimate:
    stage: str
    worker_class: str
    memory_gib: float
    seconds: float
    how: str


def pass_flops(params: int, layers: int, hidden: int, tokens: int) -> float:
    """FLOPs of one transformer pass over a joint sequence of ``tokens``: every weight's
    multiply-add per token, and attention's scores and weighted sum in every layer."""
    return 2.0 * params * tokens + 4.0 * layers * hidden * tokens ** 2


def work_scale(size: ModelSize) -> float:
    """A pass of ``size``'s transformer as a multiple of the measured one's at the same image
    tokens (1 for Qwen-Image at its published size)."""
    mine = pass_flops(size.transformer, size.layers, size.hidden,
                      size.image_tokens + size.text_tokens)
    measured = pass_flops(CALIBRATED_PARAMS, CALIBRATED_LAYERS, CALIBRATED_HIDDEN,
                          size.image_tokens + CALIBRATED_TEXT_TOKENS)
    return mine / measured


def forward_s(tokens: int, batch: int, gpu_speed: float = 1.0, work: float = 1.0) -> float:
    """Seconds of one transformer pass over ``batch`` images of ``tokens`` image tokens, for a
    transformer doing ``work`` times the measured one's (:func:`work_scale`)."""
    return (FORWARD_1024_S * (tokens / 1024) ** TOKEN_EXPONENT * batch ** BATCH_EXPONENT * work
            / gpu_speed)


def inference_memory_gib(size: ModelSize, batch: int, steps: int, keep_trajectory: bool) -> float:
    """Weights (transformer + VAE), one block's activations, and the latents held in flight."""
    weights = (size.transformer + size.vae + size.trainable) * size.weight_bytes
    tokens = size.image_tokens + size.text_tokens
    activations = batch * tokens * size.hidden * size.weight_bytes * INFERENCE_ACTIVATIONS
    latents = batch * size.image_tokens * size.latent_channels * 4 * (
        steps + 1 if keep_trajectory else 2)
    return (weights + activations + latents) / GIB


def training_memory_gib(size: ModelSize, micro_batch: int, checkpointing: bool = False,
                        passes: int = 1) -> float:
    """Weights, fp32 gradients and two Adam moments of the trainable parameters, and the
    activations the backward pass keeps: every block's (16 x micro-batch x tokens x width per
    block), or with activation checkpointing each block's input plus one block's internals.
    True CFG (``passes`` 2) keeps both passes' activations."""
    weights = (size.transformer + size.vae + size.trainable) * size.weight_bytes
    optimizer = size.trainable * 4 * 3
    tokens = size.image_tokens + size.text_tokens
    per_block = micro_batch * passes * tokens * size.hidden * size.weight_bytes
    activations = per_block * ((size.layers + 16) if checkpointing else 16 * size.layers)
    return (weights + optimizer + activations) / GIB


def explore_seconds(size: ModelSize, prompts: int, candidates: int, steps: int, batch: int,
                    cfg: bool, spot_workers: int, gpu_speed: float = 1.0) -> float:
    """Wall seconds to score ``candidates`` seeds of each prompt with ``steps``-step replays."""
    if not spot_workers:
        return 0.0
    passes = 2 if cfg else 1
    return (math.ceil(prompts * candidates / batch) * steps * passes
            * forward_s(size.image_tokens, batch, gpu_speed, work_scale(size)) / spot_workers)


def best_fitting_arm(size: ModelSize, arms: list[tuple[int, int]], window_s: float, *,
                     prompts: int, batch: int, cfg: bool, spot_workers: int,
                     gpu_speed: float = 1.0) -> tuple[int, int, float] | None:
    """The (N, M, seconds) arm with the most model evaluations that fits ``window_s``, or None."""
    fits = [(n, m, explore_seconds(size, prompts, n, m, batch, cfg, spot_workers, gpu_speed))
            for n, m in arms]
    fits = [f for f in fits if f[2] <= window_s]
    return max(fits, key=lambda f: (f[0] * f[1], f[0])) if fits else None


def iteration_estimates(size: ModelSize, *, prompts: int, group: int, steps: int, cfg: bool,
                        request_prompts: int,
                        candidates: int, explore_steps: int, explore_batch: int,
                        micro_batch: int, trained_steps: int, gpu_workers: int,
                        spot_workers: int, gpu_speed: float = 1.0, checkpointing: bool = False,
                        reference: bool = True) -> list[Estimate]:
    """Memory per worker and wall seconds per stage of one iteration (workers in parallel)."""
    passes = 2 if cfg else 1
    samples = prompts * group
    rollout_batch = max(1, min(samples, group * request_prompts))   # one rollout request
    work = work_scale(size)
    rollout_s = (math.ceil(samples / rollout_batch) * steps * passes
                 * forward_s(size.image_tokens, rollout_batch, gpu_speed, work) / gpu_workers)
    explore_n = prompts * candidates
    explore_s = explore_seconds(size, prompts, candidates, explore_steps, explore_batch, cfg,
                                spot_workers, gpu_speed)
    # Per trained step: forward + backward, a recomputed forward with checkpointing, and the
    # KL reference's forward; each of them twice with true CFG.
    adapter = size.trainable < size.transformer
    forwards = (ADAPTER_TRAIN_FORWARDS if adapter else TRAIN_FORWARDS) + checkpointing + reference
    train_s = (math.ceil(samples / micro_batch) * trained_steps * forwards * passes
               * forward_s(size.image_tokens, micro_batch, gpu_speed, work) / gpu_workers)
    scaled = "" if round(work, 3) == 1 else \
        f" x {work:.3f} (this transformer's FLOPs per pass / the measured Qwen-Image's)"
    fwd = f"forward = {FORWARD_1024_S * 1000:.0f} ms x (tokens/1024)^{TOKEN_EXPONENT} x batch^" \
          f"{BATCH_EXPONENT} / gpu_speed{scaled}"
    return [
        Estimate("rollout", "gpu", inference_memory_gib(size, rollout_batch, steps, True),
                 rollout_s, f"{samples} samples x {steps} steps x {passes} passes in batches of "
                 f"{rollout_batch}, over {gpu_workers} gpu workers; {fwd}"),
        Estimate("explore", "spot", inference_memory_gib(size, explore_batch, explore_steps,
                                                         False),
                 explore_s,
                 f"{explore_n} candidates x {explore_steps} steps x {passes} passes in batches "
                 f"of {explore_batch}, over {spot_workers} spot workers; runs while gpu trains"),
        Estimate("train", "gpu", training_memory_gib(size, micro_batch, checkpointing, passes),
                 train_s, f"{samples} samples x {trained_steps} trained steps x {forwards:g} "
                 f"forwards x {passes} passes in micro-batches of {micro_batch}, over "
                 f"{gpu_workers} gpu workers"
                 + (" (activation checkpointing)" if checkpointing else "")),
    ]
