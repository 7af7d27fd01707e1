"""What a Qwen-Image run can get wrong before any worker starts, checked from the weights' config
files alone (no weight is loaded): a missing component, a dtype the device cannot run, a
resolution the VAE and the 2x2 patching cannot take, a LoRA target that matches no module."""
from __future__ import annotations

from spotlight.config import ConfigError, rollout_sp_degree
from spotlight.models.base import register_check
from spotlight.models.diffusers_parts import (
    check_adapter_targets,
    check_resolution,
    checked_folder,
    component_config,
    image_size,
)
from spotlight.models.qwen_image.policy import QwenImagePolicy
from spotlight.models.qwen_image.weights import LAYOUT
from spotlight.parallel.ulysses import SequenceParallelError, check_degree


@register_check("qwen-image")
def check_qwen_image(config) -> None:
    from diffusers import QwenImageTransformer2DModel

    folder = checked_folder(LAYOUT, config.model)
    vae = component_config(folder, "vae")
    scale = 2 ** len(vae.get("temperal_downsample", []))
    check_resolution("Qwen-Image", *image_size(config), scale * 2,
                     f"VAE downsampling {scale} x 2x2 patches")
    transformer_config = component_config(folder, "transformer")
    _check_sp_degree(config, transformer_config, scale)
    check_adapter_targets(QwenImageTransformer2DModel, transformer_config, config.model,
                          QwenImagePolicy.own_lora_targets, QwenImagePolicy.lora_example)


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
