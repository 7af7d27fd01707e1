"""Parameter counts of an SD3.5 policy for ``--dry-run``, without loading any weight.

The components are instantiated on torch's ``meta`` device (shapes, no memory) from the configs
in the weights folder when it is a local one, else from the published Stable Diffusion 3.5
Medium configs below (stabilityai/stable-diffusion-3.5-medium: its transformer, VAE, CLIP-L,
OpenCLIP bigG and T5-XXL config files), so sizing a Hub id fetches nothing.
"""

from __future__ import annotations

import torch

from spotlight.models import diffusers_parts as parts
from spotlight.models.base import register_sizing
from spotlight.models.sd35.policy import LORA_TARGETS, T5_TOKENS
from spotlight.models.sd35.tiny import CLIP_TOKENS
from spotlight.models.sd35.weights import CLIPS, LAYOUT, T5
from spotlight.sizing import ModelSize

# The published configs, as tables (one line a component reads best).
# fmt: off
# SD3.5-Medium's MMDiT-X: 24 joint blocks of 24 heads x 64 (width 1536), the first 13 with a
# second, image-only attention; RMS-normed queries and keys.
SD35_MEDIUM_TRANSFORMER = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
    attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
    caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
SD35_VAE = dict(
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
    use_quant_conv=False, use_post_quant_conv=False)
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, projection_dim=768)
OPENCLIP_BIGG = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                     num_attention_heads=20, projection_dim=1280)
T5_XXL = dict(d_model=4096, num_layers=24, d_ff=10240, num_heads=64, d_kv=64, vocab_size=32128,
              feed_forward_proj="gated-gelu")  # T5 v1.1 XXL's encoder
# fmt: on


@register_sizing("sd3.5")
def sd35_size(config) -> ModelSize:
    """The sizes ``--dry-run`` prices: every component counted on the meta device; the joint
    sequence is the image tokens plus the 77 + 256 prompt tokens SD3.5 always attends to."""
    transformer, vae, encoders = _meta_components(parts.sizing_folder(LAYOUT, config.model.weights))
    height, width = parts.image_size(config)
    scale = 2 ** (len(vae.config.block_out_channels) - 1) * transformer.config.patch_size
    model = config.model
    trainable = (
        parts.lora_parameter_count(
            transformer, model.lora_rank, parts.lora_targets(model, LORA_TARGETS)
        )
        if model.lora_rank
        else parts.count_parameters(transformer)
    )
    return ModelSize(
        transformer=parts.count_parameters(transformer),
        vae=parts.count_parameters(vae),
        text_encoder=sum(parts.count_parameters(e) for e in encoders),
        trainable=trainable,
        weight_bytes=parts.sized_weight_bytes(model),
        hidden=transformer.config.num_attention_heads * transformer.config.attention_head_dim,
        layers=transformer.config.num_layers,
        # per image token: the 2x2 patch's channels (the same latent bytes as packed tokens)
        latent_channels=transformer.config.in_channels * transformer.config.patch_size**2,
        image_tokens=(height // scale) * (width // scale),
        text_tokens=CLIP_TOKENS + T5_TOKENS,
    )


def _meta_components(folder) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.nn.Module]]:
    """Transformer, VAE and the three text encoders on the meta device: from ``folder``'s
    configs, or (None) SD3.5-Medium's published ones."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    with torch.device("meta"):
        if folder is None:
            transformer = SD3Transformer2DModel(**SD35_MEDIUM_TRANSFORMER)
            vae = AutoencoderKL(**SD35_VAE)
            clips = [CLIPTextConfig(**CLIP_L), CLIPTextConfig(**OPENCLIP_BIGG)]
            t5 = T5Config(**T5_XXL)
        else:
            transformer = SD3Transformer2DModel.from_config(
                parts.component_config(folder, "transformer")
            )
            vae = AutoencoderKL.from_config(parts.component_config(folder, "vae"))
            clips = [CLIPTextConfig.from_pretrained(folder / name) for name in CLIPS]
            t5 = T5Config.from_pretrained(folder / T5)
        encoders = [CLIPTextModelWithProjection(c) for c in clips] + [T5EncoderModel(t5)]
    return transformer, vae, encoders
