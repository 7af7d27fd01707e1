"""Parameter counts of a Qwen-Image policy for ``--dry-run``, without loading any weight.

The components are instantiated on torch's ``meta`` device (shapes, no memory) from the configs
in the weights folder when it is a local one, else from the published Qwen-Image configs
(diffusers' class defaults; Qwen2.5-VL-7B for the text encoder).
"""
from __future__ import annotations

import torch

from spotlight.models.base import register_sizing
from spotlight.models.diffusers_parts import (
    component_config,
    count_parameters,
    image_size,
    lora_parameter_count,
    lora_targets,
    sized_weight_bytes,
    sizing_folder,
)
from spotlight.models.qwen_image.weights import LAYOUT
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

    folder = sizing_folder(LAYOUT, config.model.weights)
    with torch.device("meta"):
        if folder is not None:
            transformer = QwenImageTransformer2DModel.from_config(
                component_config(folder, "transformer"))
            vae = AutoencoderKLQwenImage.from_config(component_config(folder, "vae"))
            text = Qwen2_5_VLConfig.from_pretrained(folder / "text_encoder")
        else:
            transformer, vae = QwenImageTransformer2DModel(), AutoencoderKLQwenImage()
            text = Qwen2_5_VLConfig(**QWEN25_VL_7B)
        encoder = Qwen2_5_VLForConditionalGeneration(text)
    height, width = image_size(config)
    scale = 2 ** len(vae.temperal_downsample) * 2
    inner = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    model = config.model
    return ModelSize(
        transformer=count_parameters(transformer), vae=count_parameters(vae),
        text_encoder=count_parameters(encoder),
        trainable=lora_parameter_count(transformer, model.lora_rank,
                                       lora_targets(model)) if model.lora_rank
        else count_parameters(transformer),
        weight_bytes=sized_weight_bytes(model), hidden=inner,
        layers=transformer.config.num_layers, latent_channels=transformer.config.in_channels,
        image_tokens=(height // scale) * (width // scale))
