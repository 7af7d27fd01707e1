"""The Stable Diffusion 3.5 policy: diffusers' SD3 components behind the RL's Policy interface.

Components come from a ``StableDiffusion3Pipeline`` weights folder (see :mod:`.weights`): the
MMDiT-X transformer (trained, through a peft LoRA adapter by default), the VAE (decoding only
where a reward needs pixels) and three text encoders -- CLIP-L, OpenCLIP bigG and T5-XXL --
whose prompt embeddings are computed once per prompt, as ``StableDiffusion3Pipeline.encode_prompt``
computes them, and kept in the run store. What every diffusers policy shares (the adapter, the
prompt store, the trainable state, the KL reference) is
:class:`spotlight.models.diffusers_policy.DiffusersPolicy`'s.

SD3's latents are not packed: the transformer patchifies them itself. A latent of ``h x w`` with
16 channels travels as ``(h w, 16)`` -- each latent pixel a row, channels last -- and is viewed
back as ``(16, h, w)`` for the transformer and the VAE. A velocity is the transformer's output at
``timestep = sigma x 1000`` (the scheduler's ``num_train_timesteps``), as the pipeline passes
``scheduler.timesteps``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from spotlight.models import diffusers_parts as parts
from spotlight.models.base import register_base, register_decoder, register_policy
from spotlight.models.device import autocast, place, resolve_device, to_device
from spotlight.models.diffusers_policy import DiffusersPolicy
from spotlight.models.sd35.weights import (
    Components,
    TextEncoders,
    load_components,
    local_folder,
    scheduler_sigmas,
    timestep_scale,
)

T5_TOKENS = 256  # the pipeline's max_sequence_length: T5's prompt is padded to it
# Flow-GRPO's SD3.5 targets (scripts/train_sd3.py): the joint attention's projections, of both
# streams; the dual-attention blocks' second (image-only) attention is left as it is.
LORA_TARGETS = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
)


@register_policy("sd3.5", prompt_store=True)
def sd35_policy(config) -> "SD35Policy":
    """``model.policy: sd3.5``: the components of ``model.weights`` on ``model.device``, adapter
    freshly initialised (a checkpoint's state then replaces it). The text encoders are loaded
    only when a prompt is not in the prompt store."""
    device = resolve_device(config.model.device)
    dtype = parts.placement_dtype(config.model.dtype, device)
    components = load_components(config.model.weights, dtype, text_encoders=False)
    return SD35Policy(components, config.model, *parts.image_size(config), device=device)


@register_base("sd3.5")
def sd35_base(config, progress: bool = True) -> "SD35Policy":
    """The base: the weights as loaded, with a fresh adapter (LoRA B = 0: the identity)."""
    return sd35_policy(config)


class SD35Policy(DiffusersPolicy):
    """Implements :class:`spotlight.models.base.Policy` over SD3.5 components."""

    name = "sd3.5"
    own_lora_targets = LORA_TARGETS
    lora_example = "'attn.to_q' or 'attn.to_add_out'"

    def __init__(
        self,
        components: Components,
        model_config,
        height: int,
        width: int,
        device: torch.device | str | None = None,
    ) -> None:
        vae_scale = 2 ** (len(components.vae.config.block_out_channels) - 1)
        check_size(height, width, vae_scale, components.transformer.config)
        super().__init__(components, model_config, height, width, vae_scale, device)
        self.timestep_scale = timestep_scale(components.folder)

    # --- shapes ----------------------------------------------------------------------------
    @property
    def tokens_shape(self) -> tuple[int, int]:
        h, w = self.latent_hw
        return h * w, self.vae.config.latent_channels

    # --- prompts ---------------------------------------------------------------------------
    @property
    def text_encoder_loaded(self) -> bool:
        return self.components.text is not None

    def text_encoders(self) -> TextEncoders:
        """The three text encoders, loaded on first use and placed on this policy's device."""
        text = self.components.load_text_encoders()
        for encoder in (*text.clips, text.t5):
            place(encoder, self.device)
        return text

    @torch.no_grad()
    def embed_prompt(self, prompt: str) -> np.ndarray:
        """One prompt's conditioning as ``StableDiffusion3Pipeline.encode_prompt`` computes it
        (:func:`encode_prompt`), packed into one float32 array (:func:`pack_prompt`)."""
        embedding, pooled = encode_prompt(self.text_encoders(), prompt, self.device)
        return pack_prompt(embedding[0].float().cpu().numpy(), pooled[0].float().cpu().numpy())

    def encode(self, prompts: list[str]) -> "Conditioning":
        """Prompt embeddings and pooled embeddings on this policy's device; with true CFG also
        the negative prompt's."""
        negative = self._batch([self.negative_prompt] * len(prompts)) if self.true_cfg > 1 else None
        return Conditioning(*self._batch(prompts), negative)

    def _batch(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, width) embeddings and (B, pooled) on the device (every prompt has the same
        length: the pipeline pads CLIP's to 77 tokens and T5's to 256)."""
        pooled_dim = self.transformer.config.pooled_projection_dim
        unpacked = [unpack_prompt(self.prompt_embedding(p), pooled_dim) for p in prompts]
        embedding, pooled = (torch.stack(part).to(self._dtype) for part in zip(*unpacked))
        return to_device(embedding, self.device), to_device(pooled, self.device)

    def model_sigmas(self, num_steps: int) -> torch.Tensor:
        return scheduler_sigmas(self.components.folder, num_steps)

    # --- denoising -------------------------------------------------------------------------
    def velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, text: "Conditioning"
    ) -> torch.Tensor:
        """The transformer's velocity; with true CFG the pipeline's guided one."""
        cond = self._transformer_velocity(latents, sigma, text.embedding, text.pooled)
        if text.negative is None:
            return cond
        uncond = self._transformer_velocity(latents, sigma, *text.negative)
        return uncond + self.true_cfg * (cond - uncond)  # StableDiffusion3Pipeline's CFG

    def _transformer_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        embedding: torch.Tensor,
        pooled: torch.Tensor,
    ) -> torch.Tensor:
        dtype, batch = self._dtype, latents.shape[0]
        # float32, as the pipeline's scheduler.timesteps: bfloat16 cannot tell 996 from 1000
        timestep = (sigma.to(self.device, torch.float32) * self.timestep_scale).expand(batch)
        with autocast(self.device, dtype):
            out = self.transformer(
                hidden_states=to_spatial(latents.to(self.device, dtype), self.latent_hw),
                encoder_hidden_states=embedding,
                pooled_projections=pooled,
                timestep=timestep,
                return_dict=False,
            )[0]
        return to_rows(out).to(latents.dtype)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Latents (B, h w, 16) -> float32 pixels (B, 3, H, W) in [0, 1], as the pipeline
        decodes."""
        return vae_decode(self.vae, latents, self.latent_hw)


class Conditioning(NamedTuple):
    """What ``encode`` gives ``velocity``: embeddings (B, T, width), pooled embeddings
    (B, pooled), and with true CFG the negative prompt's (embedding, pooled)."""

    embedding: torch.Tensor
    pooled: torch.Tensor
    negative: tuple[torch.Tensor, torch.Tensor] | None = None


def encode_prompt(
    text: TextEncoders, prompt: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``StableDiffusion3Pipeline.encode_prompt`` for one prompt (the same text to all three
    encoders, no clip skip): each CLIP's second-to-last hidden state over 77 padded tokens,
    concatenated along channels and zero-padded to T5's width, then T5's last hidden state over
    256 padded tokens appended along the sequence; pooled = the two CLIP projections,
    concatenated. Returns (1, 77 + 256, T5 width) and (1, pooled)."""
    hidden, pooled = [], []
    for tokenizer, encoder in zip(text.clip_tokenizers, text.clips):
        ids = tokenizer(
            [prompt],
            padding="max_length",
            max_length=text.clip_tokenizers[0].model_max_length,  # the pipeline's, for both
            truncation=True,
            return_tensors="pt",
        ).input_ids
        out = encoder(ids.to(device), output_hidden_states=True)
        pooled.append(out[0])
        hidden.append(out.hidden_states[-2])
    ids = text.t5_tokenizer(
        [prompt],
        padding="max_length",
        max_length=T5_TOKENS,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    ).input_ids
    t5 = text.t5(ids.to(device))[0]
    clip = torch.cat(hidden, dim=-1)
    clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
    return torch.cat([clip.to(t5.dtype), t5], dim=-2), torch.cat(pooled, dim=-1)


def pack_prompt(embedding: np.ndarray, pooled: np.ndarray) -> np.ndarray:
    """(T, width) embedding and (pooled,) vector as one (T + rows, width) float32 array -- the
    one array a run store keeps per prompt: the pooled vector zero-padded into the last ``rows``
    = ceil(pooled / width) rows."""
    width = embedding.shape[-1]
    rows = math.ceil(pooled.shape[0] / width)
    tail = np.zeros(rows * width, np.float32)
    tail[: pooled.shape[0]] = pooled
    return np.concatenate([embedding.astype(np.float32), tail.reshape(rows, width)])


def unpack_prompt(packed: torch.Tensor, pooled_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack_prompt` undone: (T, width) embedding and (pooled_dim,) vector."""
    rows = math.ceil(pooled_dim / packed.shape[-1])
    return packed[:-rows], packed[-rows:].reshape(-1)[:pooled_dim]


def to_spatial(latents: torch.Tensor, latent_hw: tuple[int, int]) -> torch.Tensor:
    """(B, h w, C) rows -> (B, C, h, w), the layout SD3's transformer and VAE take."""
    h, w = latent_hw
    return latents.view(latents.shape[0], h, w, -1).permute(0, 3, 1, 2)


def to_rows(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h w, C): :func:`to_spatial` undone."""
    b, c = latents.shape[:2]
    return latents.permute(0, 2, 3, 1).reshape(b, -1, c)


@torch.no_grad()
def vae_decode(vae: nn.Module, latents: torch.Tensor, latent_hw: tuple[int, int]) -> np.ndarray:
    """Latents (B, h w, 16) -> float32 pixels (B, 3, H, W) in [0, 1]: un-normalised with the
    VAE's scaling and shift factors and decoded, as StableDiffusion3Pipeline does."""
    x = to_spatial(latents.detach(), latent_hw).to(vae.device, vae.dtype)
    x = x / vae.config.scaling_factor + vae.config.shift_factor
    return parts.unit_pixels(vae.decode(x, return_dict=False)[0])


@register_decoder("sd3.5")
def sd35_decoder(config) -> Callable[[np.ndarray], np.ndarray]:
    """For the audit: a stored latent (h w, 16) or batch (B, h w, 16) -> its images stacked top
    to bottom (H, W, 3); only the VAE is loaded."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(
        local_folder(config.model.weights) / "vae",
        torch_dtype=parts.resolve_dtype(config.model.dtype),
    ).eval()
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    height, width = parts.image_size(config)
    return parts.stacked_images(
        lambda latents: vae_decode(vae, latents, (height // scale, width // scale))
    )


def check_size(height: int, width: int, vae_scale: int, transformer: Mapping[str, Any]) -> None:
    """An error unless the VAE and the transformer's patches take ``height`` x ``width``, and its
    position embedding (``pos_embed_max_size`` patches a side) covers them."""
    patch = transformer["patch_size"]
    parts.check_resolution(
        "SD3.5",
        height,
        width,
        vae_scale * patch,
        f"VAE downsampling {vae_scale} x {patch}x{patch} patches",
    )
    largest = transformer["pos_embed_max_size"] * patch * vae_scale
    if max(height, width) > largest:
        raise ValueError(
            f"image size {height}x{width}: these SD3.5 weights position at most "
            f"{transformer['pos_embed_max_size']} patches a side, so {largest} pixels; set "
            "world.canvas_height / canvas_width (or model.height / model.width) within it"
        )
