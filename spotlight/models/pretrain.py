"""Flow-matching pretraining of the digits base model, cached by config hash.

The base model must be good enough to render recognisable digits and imperfect enough that RL
has room to improve it; a few minutes on 2 CPU cores lands there. The cache key covers every
config section that shapes the result, so the demo, benchmarks and tests reuse one base model.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from spotlight.cache import model_dir, write_atomically
from spotlight.config import RunConfig, config_hash
from spotlight.models.base import register_base
from spotlight.models.policy import DigitsPolicy, pack
from spotlight.models.world import random_prompt, render, to_model_space

CODE_VERSION = 2  # bump when the world or the training recipe changes what a config produces


@dataclass
class PretrainResult:
    directory: Path
    steps: int
    wall_s: float
    final_loss: float
    cached: bool


def base_model_dir(config: RunConfig) -> Path:
    # The model fields without ``policy`` (only the digits policy is pretrained here) and
    # ``device`` (where it runs): base models cached before those fields existed keep their key.
    model = {k: v for k, v in dataclasses.asdict(config.model).items()
             if k not in ("policy", "device")}
    key = config_hash(config.world.task, config.world.canvas_height, config.world.canvas_width,
                      config.world.glyphs_per_class, model, config.pretrain, CODE_VERSION)
    return model_dir(f"base-{config.world.task}-{key}")


def composed_batch(config: RunConfig, rng: np.random.Generator) -> tuple[list[str], torch.Tensor]:
    """Random prompts of the task and canvases drawn for them, in model space."""
    world = config.world
    prompts = [random_prompt(world.task, rng) for _ in range(config.pretrain.batch_size)]
    canvases = np.stack([render(p, world.canvas_height, world.canvas_width, rng,
                                world.glyphs_per_class) for p in prompts])
    return [p.text for p in prompts], torch.from_numpy(to_model_space(canvases))


def _lr_factor(step: int, progress: float, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def pretrain(config: RunConfig, *, force: bool = False, progress: bool = True) -> PretrainResult:
    """Train (or load from cache) the base model for ``config``; returns where it lives."""
    directory = base_model_dir(config)
    if not force and (directory / "pretrain.json").is_file():  # written last: the commit
        meta = json.loads((directory / "pretrain.json").read_text())
        return PretrainResult(directory, meta["steps"], meta["wall_s"], meta["final_loss"], True)
    torch.set_num_threads(config.threads)
    cfg = config.pretrain
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    policy = DigitsPolicy(config.model, config.world.canvas_height, config.world.canvas_width)
    ema = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.01)
    start, losses, step = time.monotonic(), [], 0
    bar = tqdm(total=cfg.steps, desc="pretrain", disable=not progress, leave=False)
    while step < cfg.steps:
        elapsed = time.monotonic() - start
        if elapsed > cfg.time_budget_s:
            break
        frac = max(step / cfg.steps, elapsed / cfg.time_budget_s)
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, frac, cfg.warmup_steps)
        texts, data = composed_batch(config, rng)
        x0 = pack(data)
        noise = torch.randn_like(x0)
        # Logit-normal sigmas (as SD3) concentrate training on mid-noise levels where layout forms.
        sigma = torch.sigmoid(torch.randn(x0.shape[0]))
        xt = (1 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        # Per-sample timesteps: call the transformer directly with a (B,) sigma vector.
        pred = policy.velocity(xt, sigma, policy.encode(texts))
        loss = torch.nn.functional.mse_loss(pred, noise - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        decay = min(0.995, (1 + step) / (10 + step))
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), policy.parameters()):
                p_ema.lerp_(p, 1 - decay)
        losses.append(loss.item())
        step += 1
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
    bar.close()
    wall = time.monotonic() - start
    final_loss = float(np.mean(losses[-50:])) if losses else float("nan")
    ema.save(directory)
    meta = {"steps": step, "wall_s": wall, "final_loss": final_loss, "config": config.to_dict(),
            "loss_curve": [float(np.mean(losses[i:i + 50])) for i in range(0, len(losses), 50)]}
    write_atomically(directory / "pretrain.json",   # the commit: written last, whole
                     lambda f: Path(f).write_text(json.dumps(meta, indent=2)))
    return PretrainResult(directory, step, wall, final_loss, False)


def load_base_policy(config: RunConfig) -> DigitsPolicy:
    """The cached base model of ``config``; a clear error if it was never pretrained."""
    return DigitsPolicy.load(base_model_dir(config))


@register_base("digits")
def digits_base(config: RunConfig, progress: bool = True) -> DigitsPolicy:
    """The pretrained base of a digits config (trained once, then cached by config hash)."""
    pretrain(config, progress=progress)
    return load_base_policy(config)
