"""The Qwen-Image policy: diffusers' QwenImage components behind the RL's Policy interface.

Components come from a weights folder in diffusers' layout (see :mod:`.weights`): the
transformer (trained, through a peft LoRA adapter by default), the VAE (decoding only where a
reward needs pixels), the Qwen2.5-VL text encoder and its tokenizer (prompt embeddings, computed
once per prompt). Latents are packed exactly as ``QwenImagePipeline`` packs them, and a
velocity is the transformer's output at ``timestep = sigma``, as in the pipeline. What every
diffusers policy shares -- the adapter, the prompt store, the trainable state, the KL reference
-- is :class:`spotlight.models.diffusers_policy.DiffusersPolicy`'s.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from spotlight.models.base import register_base, register_decoder, register_policy
from spotlight.models.device import autocast, place, resolve_device, to_device
from spotlight.models.diffusers_parts import (
    check_resolution,
    image_size,
    placement_dtype,
    resolve_dtype,
    stacked_images,
    unit_pixels,
)
from spotlight.models.diffusers_policy import DiffusersPolicy
from spotlight.models.qwen_image.template import PROMPT_TEMPLATE, TEMPLATE_DROP
from spotlight.models.qwen_image.weights import (
    Components,
    load_components,
    local_folder,
    scheduler_sigmas,
)


@register_policy("qwen-image", prompt_store=True)
def qwen_image_policy(config) -> "QwenImagePolicy":
    """``model.policy: qwen-image``: the components of ``model.weights`` on ``model.device``,
    adapter freshly initialised (a checkpoint's state then replaces it). The text encoder is
    loaded only when a prompt is not in the prompt store (see
    :meth:`QwenImagePolicy.use_prompt_store`)."""
    device = resolve_device(config.model.device)
    components = load_components(config.model.weights, placement_dtype(config.model.dtype, device),
                                 text_encoder=False)
    return QwenImagePolicy(components, config.model, *image_size(config), device=device)


@register_base("qwen-image")
def qwen_image_base(config, progress: bool = True) -> "QwenImagePolicy":
    """The base: the weights as loaded, with a fresh adapter (LoRA B = 0: the identity)."""
    return qwen_image_policy(config)


class QwenImagePolicy(DiffusersPolicy):
    """Implements :class:`spotlight.models.base.Policy` over QwenImage components."""

    name = "qwen-image"   # model.lora_targets' default is this model's: no targets of its own
    lora_example = "'to_q' or 'img_mlp.net.2'"

    def __init__(self, components: Components, model_config, height: int, width: int,
                 device: torch.device | str | None = None) -> None:
        vae_scale = 2 ** len(components.vae.temperal_downsample)
        check_resolution("Qwen-Image", height, width, vae_scale * 2,
                         f"VAE downsampling {vae_scale} x 2x2 patches")
        super().__init__(components, model_config, height, width, vae_scale, device)

    # --- shapes ----------------------------------------------------------------------------
    @property
    def tokens_shape(self) -> tuple[int, int]:
        h, w = self.latent_hw
        return (h // 2) * (w // 2), self.vae.config.z_dim * 4

    # --- prompts ---------------------------------------------------------------------------
    @property
    def text_encoder_loaded(self) -> bool:
        return self.components.text_encoder is not None

    @property
    def text_encoder(self) -> nn.Module:
        return self._load_text_encoder()

    @property
    def tokenizer(self) -> Any:
        self._load_text_encoder()
        return self.components.tokenizer

    def _load_text_encoder(self) -> nn.Module:
        """The text encoder, loaded on first use and placed on this policy's device."""
        self.components.load_text_encoder()
        return place(self.components.text_encoder, self.device)

    @torch.no_grad()
    def embed_prompt(self, prompt: str) -> np.ndarray:
        """(tokens, dim) float32 embedding of one prompt, as ``QwenImagePipeline.encode_prompt``
        computes it (template, text encoder's last hidden state, template prefix dropped)."""
        encoder = self._load_text_encoder()
        tokens = self.components.tokenizer([PROMPT_TEMPLATE.format(prompt)], return_tensors="pt",
                                           truncation=True, max_length=1024 + TEMPLATE_DROP)
        out = encoder(input_ids=tokens.input_ids.to(self.device),
                      attention_mask=tokens.attention_mask.to(self.device),
                      output_hidden_states=True)
        return out.hidden_states[-1][0, TEMPLATE_DROP:].float().cpu().numpy()

    def encode(self, prompts: list[str]) -> "Conditioning":
        """Padded prompt embeddings and masks on this policy's device; with true CFG also the
        negative prompt's."""
        negative = (self._padded([self.prompt_embedding(self.negative_prompt)] * len(prompts))
                    if self.true_cfg > 1 else None)
        return Conditioning(*self._padded([self.prompt_embedding(p) for p in prompts]), negative)

    def _padded(self, embeddings: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Embeddings padded into one batch on the device, and their mask -- None where no
        token is padding, as QwenImagePipeline passes it (attention then takes its fastest,
        unmasked kernel); decided on the host, so it costs the device nothing."""
        embedding, mask = _pad(embeddings, self._dtype)
        return (to_device(embedding, self.device),
                None if bool(mask.all()) else to_device(mask, self.device))

    def model_sigmas(self, num_steps: int) -> torch.Tensor:
        """The weights' FlowMatchEulerDiscreteScheduler with its dynamic shift at this
        resolution, as QwenImagePipeline sets it."""
        return scheduler_sigmas(self.components.folder, num_steps, self.tokens_shape[0])

    # --- denoising -------------------------------------------------------------------------
    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor,
                 text: "Conditioning") -> torch.Tensor:
        """The transformer's velocity; with true CFG the pipeline's guided, norm-rescaled one."""
        cond = self._transformer_velocity(latents, sigma, text.embedding, text.mask)
        if text.negative is None:
            return cond
        uncond = self._transformer_velocity(latents, sigma, *text.negative)
        return guided_velocity(cond, uncond, self.true_cfg)

    def _transformer_velocity(self, latents: torch.Tensor, sigma: torch.Tensor,
                              embedding: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h, w = self.latent_hw
        dtype = self._dtype
        with autocast(self.device, dtype):
            out = self.transformer(
                hidden_states=latents.to(self.device, dtype), encoder_hidden_states=embedding,
                encoder_hidden_states_mask=mask,
                timestep=sigma.to(self.device).expand(latents.shape[0]).to(dtype),
                img_shapes=[[(1, h // 2, w // 2)]] * latents.shape[0], return_dict=False)[0]
        return out.to(latents.dtype)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Packed latents -> float32 pixels (B, 3, H, W) in [0, 1], as the pipeline decodes."""
        return vae_decode(self.vae, latents, self.latent_hw)


@torch.no_grad()
def vae_decode(vae: nn.Module, latents: torch.Tensor, latent_hw: tuple[int, int]) -> np.ndarray:
    """Packed latents (B, tokens, 4 z) -> float32 pixels (B, 3, H, W) in [0, 1]: unpacked 2x2,
    de-normalised with the VAE's latents mean/std and decoded, as QwenImagePipeline does."""
    h, w = latent_hw
    z = vae.config.z_dim
    b = latents.shape[0]
    x = latents.detach().view(b, h // 2, w // 2, z, 2, 2).permute(0, 3, 1, 4, 2, 5)
    x = x.reshape(b, z, 1, h, w).to(vae.device, vae.dtype)
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(x.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(x.dtype)
    mean, std = to_device(mean, x.device), to_device(std, x.device)
    return unit_pixels(vae.decode(x * std + mean, return_dict=False)[0][:, :, 0])


@register_decoder("qwen-image")
def qwen_image_decoder(config) -> Callable[[np.ndarray], np.ndarray]:
    """For the audit: a stored latent (tokens, 4 z) or batch (B, tokens, 4 z) -> its images
    stacked top to bottom (H, W, 3); only the VAE is loaded."""
    from diffusers import AutoencoderKLQwenImage

    dtype = resolve_dtype(config.model.dtype)
    vae = AutoencoderKLQwenImage.from_pretrained(local_folder(config.model.weights) / "vae",
                                                 torch_dtype=dtype).eval()
    height, width = image_size(config)
    scale = 2 ** len(vae.temperal_downsample)
    return stacked_images(lambda latents: vae_decode(vae, latents,
                                                     (height // scale, width // scale)))


class Conditioning(NamedTuple):
    """What ``encode`` gives ``velocity``: padded embeddings (B, T, dim), their mask (B, T), and
    with true CFG the negative prompt's (embedding, mask)."""

    embedding: torch.Tensor
    mask: torch.Tensor
    negative: tuple[torch.Tensor, torch.Tensor] | None = None


def _pad(embeddings: list[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(e.shape[0] for e in embeddings)
    out = torch.zeros(len(embeddings), length, embeddings[0].shape[1], dtype=dtype)
    mask = torch.zeros(len(embeddings), length, dtype=torch.long)
    for i, e in enumerate(embeddings):
        out[i, :e.shape[0]], mask[i, :e.shape[0]] = e.to(dtype), 1
    return out, mask


def guided_velocity(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """QwenImagePipeline's true CFG: uncond + scale (cond - uncond), rescaled per token to the
    conditional prediction's norm."""
    combined = uncond + scale * (cond - uncond)
    return combined * (cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))
