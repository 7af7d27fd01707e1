"""What a Qwen-Image run can get wrong before any worker starts, checked from the weights' config
files alone (no weight is loaded): a missing component, a dtype the device cannot run, a
resolution the VAE and the 2x2 patching cannot take, a LoRA target that matches no module."""
from __future__ import annotations

import json

import torch

from spotlight.config import ConfigError, rollout_sp_degree
from spotlight.models.base import register_check
from spotlight.models.qwen_image.policy import check_lora_targets, check_resolution, image_size
from spotlight.models.qwen_image.weights import local_folder, resolve_dtype
from spotlight.parallel.ulysses import SequenceParallelError, check_degree


@register_check("qwen-image")
def check_qwen_image(config) -> None:
    from diffusers import QwenImageTransformer2DModel

    resolve_dtype(config.model.dtype)
    # names a missing component; copies a URL once; of a Hub id, fetches only the config files
    folder = local_folder(config.model.weights, configs_only=True)
    vae = json.loads((folder / "vae" / "config.json").read_text())
    scale = 2 ** len(vae.get("temperal_downsample", []))
    check_resolution(*image_size(config), scale)
    transformer_config = json.loads((folder / "transformer" / "config.json").read_text())
    _check_sp_degree(config, transformer_config, scale)
    if config.model.lora_rank > 0:
        with torch.device("meta"):
            transformer = QwenImageTransformer2DModel.from_config(transformer_config)
        check_lora_targets(transformer, config.model.lora_targets)


def _check_sp_degree(config, transformer_config: dict, vae_scale: int) -> None:
    """The rollout's SP degree must divide the weights' attention heads and the image tokens."""
    height, width = image_size(config)
    tokens = (height // vae_scale // 2) * (width // vae_scale // 2)
    try:
        check_degree(rollout_sp_degree(config),
                     heads=transformer_config.get("num_attention_heads"), image_tokens=tokens)
    except SequenceParallelError as err:
        raise ConfigError(f"parallel.size_classes ({height}x{width}) with the weights of "
                          f"{config.model.weights}: {err}") from None
