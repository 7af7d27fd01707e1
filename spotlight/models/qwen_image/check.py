"""What a Qwen-Image run can get wrong before any worker starts, checked from the weights' config
files alone (no weight is loaded): a missing component, a dtype the device cannot run, a
resolution the VAE and the 2x2 patching cannot take, a LoRA target that matches no module."""
from __future__ import annotations

import json

import torch

from spotlight.models.base import register_check


@register_check("qwen-image")
def check_qwen_image(config) -> None:
    from diffusers import QwenImageTransformer2DModel

    from spotlight.models.qwen_image.policy import check_lora_targets, check_resolution, image_size
    from spotlight.models.qwen_image.weights import local_folder, resolve_dtype

    resolve_dtype(config.model.dtype)
    folder = local_folder(config.model.weights)   # names a missing component; copies a URL once
    vae = json.loads((folder / "vae" / "config.json").read_text())
    check_resolution(*image_size(config), 2 ** len(vae.get("temperal_downsample", [])))
    if config.model.lora_rank > 0:
        transformer_config = json.loads((folder / "transformer" / "config.json").read_text())
        with torch.device("meta"):
            transformer = QwenImageTransformer2DModel.from_config(transformer_config)
        check_lora_targets(transformer, config.model.lora_targets)
