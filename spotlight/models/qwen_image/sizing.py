"""Parameter counts of a Qwen-Image policy for ``--dry-run``, without loading any weight.

The components are instantiated on torch's ``meta`` device (shapes, no memory) from the configs
in the weights folder when it is a local one, else from the published Qwen-Image configs
(diffusers' class defaults; Qwen2.5-VL-7B for the text encoder).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from spotlight.models.base import register_sizing
from spotlight.models.qwen_image.policy import image_size
from spotlight.models.qwen_image.weights import TINY, local_folder, resolve_dtype
from spotlight.sizing import ModelSize

# Qwen2.5-VL-7B-Instruct, Qwen-Image's text encoder (its published config).
QWEN25_VL_7B = {"text_config": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                    num_hidden_layers=28, num_attention_heads=28,
                                    num_key_value_heads=4),
                "vision_config": dict(depth=32, hidden_size=1280, intermediate_size=3420,
                                      num_heads=16, out_hidden_size=3584)}


@register_sizing("qwen-image")
def qwen_image_size(config) -> ModelSize:
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    folder = _local(config.model.weights)
    with torch.device("meta"):
        if folder is not None:
            transformer = QwenImageTransformer2DModel.from_config(_config(folder / "transformer"))
            vae = AutoencoderKLQwenImage.from_config(_config(folder / "vae"))
            text = Qwen2_5_VLConfig.from_pretrained(folder / "text_encoder")
        else:
            transformer, vae = QwenImageTransformer2DModel(), AutoencoderKLQwenImage()
            text = Qwen2_5_VLConfig(**QWEN25_VL_7B)
        encoder = Qwen2_5_VLForConditionalGeneration(text)
    height, width = image_size(config)
    scale = 2 ** len(vae.temperal_downsample) * 2
    inner = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    dtype = torch.bfloat16 if config.model.dtype == "auto" and config.model.weights != TINY \
        else resolve_dtype(config.model.dtype)
    return ModelSize(
        transformer=_count(transformer), vae=_count(vae), text_encoder=_count(encoder),
        trainable=_lora_count(transformer, config.model) if config.model.lora_rank
        else _count(transformer),
        weight_bytes=torch.tensor([], dtype=dtype).element_size(), hidden=inner,
        layers=transformer.config.num_layers, latent_channels=transformer.config.in_channels,
        image_tokens=(height // scale) * (width // scale))


def _local(weights: str) -> Path | None:
    if weights == TINY:
        return local_folder(weights)
    path = Path(weights.removeprefix("file://")).expanduser()
    return path if "://" not in weights.removeprefix("file://") and path.is_dir() else None


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _lora_count(transformer: torch.nn.Module, model) -> int:
    """r x (in + out) for every linear layer a LoRA target names."""
    total = 0
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear) and any(
                name == t or name.endswith("." + t) for t in model.lora_targets):
            total += model.lora_rank * (module.in_features + module.out_features)
    return total
