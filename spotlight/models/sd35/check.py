"""What an SD3.5 run can get wrong before any worker starts, checked from the weights' config
files alone (no weight is loaded): a missing component, a dtype the device cannot run, an image
size the VAE and the transformer's patches cannot take (multiples of 16 for SD3.5: VAE 8 x patch
2) or its position embedding does not cover, a LoRA target that matches no module, and sequence
parallelism (its Ulysses attention is Qwen-Image's alone)."""

from __future__ import annotations

from spotlight.config import ConfigError, rollout_sp_degree
from spotlight.models import diffusers_parts as parts
from spotlight.models.base import register_check
from spotlight.models.sd35.policy import SD35Policy, check_size
from spotlight.models.sd35.weights import LAYOUT


@register_check("sd3.5")
def check_sd35(config) -> None:
    from diffusers import SD3Transformer2DModel

    folder = parts.checked_folder(LAYOUT, config.model)
    vae_scale = 2 ** (len(parts.component_config(folder, "vae")["block_out_channels"]) - 1)
    transformer = parts.component_config(folder, "transformer")
    check_size(*parts.image_size(config), vae_scale, transformer)
    degree = rollout_sp_degree(config)
    if degree > 1:
        raise ConfigError(
            f"parallel.size_classes gives this run's rollout requests sp_degree {degree}, but "
            "sequence parallelism splits Qwen-Image's attention only; for model.policy sd3.5 "
            "leave the image size at sp_degree 1 (an SD3.5-Medium rollout fits one GPU)"
        )
    parts.check_adapter_targets(
        SD3Transformer2DModel,
        transformer,
        config.model,
        SD35Policy.own_lora_targets,
        SD35Policy.lora_example,
    )
