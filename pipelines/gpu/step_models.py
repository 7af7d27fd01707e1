"""The models the steps part measures, each with random components built on the device.

Qwen-Image's transformer at its published size (20.4 B parameters) and SD3.5-Medium's (2.2 B),
each with its VAE, in the dtype a run places them in -- random weights born on the device, so
nothing is downloaded and no float32 copy of a large model has to fit first -- or, at size
``tiny``, the tiny real-format components the CPU test runs. Prompts come from a prompt store
that answers one random embedding of the model's text tokens (no text encoder is loaded).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from spotlight.config import PROJECT_ROOT, RunConfig
from spotlight.models.diffusers_parts import placement_dtype
from spotlight.models.qwen_image import tiny as qwen_tiny
from spotlight.models.qwen_image.policy import QwenImagePolicy
from spotlight.models.qwen_image.weights import Components as QwenComponents
from spotlight.models.sd35 import tiny as sd35_tiny
from spotlight.models.sd35.policy import SD35Policy, pack_prompt
from spotlight.models.sd35.sizing import SD35_MEDIUM_TRANSFORMER, SD35_VAE
from spotlight.models.sd35.weights import Components as SD35Components
from spotlight.models.sd35.weights import local_folder as sd35_folder


@dataclass(frozen=True)
class StepModel:
    """One model of the steps part: where its figures go, the run configs each scale is
    measured with, and how its random components and policy are made."""

    section: str                                  # the record's key: steps, steps_sd35
    real: dict[str, tuple[str, int]]              # scale -> (config file, image side)
    tiny: dict[str, int]                          # scale -> image side of the tiny config
    tiny_config: str
    modules: Callable[[str], tuple[Any, Any]]     # size -> (transformer, VAE), random
    policy: Callable[[tuple[Any, Any], RunConfig, torch.device, torch.dtype], Any]
    embedding: Callable[[Any, int], np.ndarray]   # (policy, text tokens) -> a prompt's array

    def scales(self, size: str) -> tuple[str, ...]:
        return tuple(self.real if size == "real" else self.tiny)


def _qwen_modules(size: str) -> tuple[Any, Any]:
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    if size == "real":
        return QwenImageTransformer2DModel(), AutoencoderKLQwenImage()
    return qwen_tiny.build_transformer(), qwen_tiny.build_vae()


def _qwen_policy(modules, config: RunConfig, device: torch.device, dtype: torch.dtype):
    transformer, vae = modules
    components = QwenComponents(transformer=transformer.eval(), vae=vae.eval(),
                                folder=PROJECT_ROOT, dtype=dtype)
    return QwenImagePolicy(components, config.model, config.model.height, config.model.width,
                           device=device)


def _qwen_embedding(policy, text_tokens: int) -> np.ndarray:
    width = policy.transformer.config.joint_attention_dim
    return np.random.default_rng(0).standard_normal((text_tokens, width)).astype(np.float32)


def _sd35_modules(size: str) -> tuple[Any, Any]:
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    if size == "real":
        return SD3Transformer2DModel(**SD35_MEDIUM_TRANSFORMER), AutoencoderKL(**SD35_VAE)
    return sd35_tiny.build_transformer(), sd35_tiny.build_vae()


def _sd35_policy(modules, config: RunConfig, device: torch.device, dtype: torch.dtype):
    transformer, vae = modules
    # The tiny folder's scheduler config is SD3.5's (shift 3, 1000 training timesteps).
    components = SD35Components(transformer=transformer.eval(), vae=vae.eval(),
                                folder=sd35_folder("tiny"), dtype=dtype)
    return SD35Policy(components, config.model, config.model.height, config.model.width,
                      device=device)


def _sd35_embedding(policy, text_tokens: int) -> np.ndarray:
    config = policy.transformer.config
    rng = np.random.default_rng(0)
    return pack_prompt(rng.standard_normal((text_tokens, config.joint_attention_dim)),
                       rng.standard_normal(config.pooled_projection_dim))


MODELS = {
    "qwen-image": StepModel(
        "steps", {"512": ("qwen-image-512.yaml", 512), "1280": ("qwen-image-1280.yaml", 1280)},
        {"32": 32, "64": 64}, "qwen-image-tiny.yaml", _qwen_modules, _qwen_policy,
        _qwen_embedding),
    "sd3.5": StepModel(
        "steps_sd35", {"512": ("sd35-medium-ocr.yaml", 512), "1024": ("sd35-medium-ocr.yaml",
                                                                     1024)},
        {"32": 32, "64": 64}, "sd35-tiny.yaml", _sd35_modules, _sd35_policy, _sd35_embedding),
}


def build_policy(model: StepModel, size: str, config: RunConfig, text_tokens: int):
    """``model``'s policy of ``config`` over random components created on the device in the
    run's dtype; every prompt's embedding is one random array of ``text_tokens`` tokens."""
    device = torch.device(config.model.device)
    dtype = placement_dtype(config.model.dtype, device)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            modules = model.modules(size)
    finally:
        torch.set_default_dtype(previous)
    policy = model.policy(modules, config, device, dtype)
    embedding = model.embedding(policy, text_tokens)
    policy.use_prompt_store(lambda prompt: embedding)
    return policy
