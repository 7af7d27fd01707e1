"""The Qwen-Image policy: diffusers' QwenImage components behind the RL's Policy interface.

Components come from a weights folder in diffusers' layout (see :mod:`.weights`): the
transformer (trained, through a peft LoRA adapter by default), the VAE (decoding only where a
reward needs pixels), the Qwen2.5-VL text encoder and its tokenizer (prompt embeddings, computed
once per prompt). Latents are packed exactly as ``QwenImagePipeline`` packs them, and a
velocity is the transformer's output at ``timestep = sigma``, as in the pipeline.

With LoRA the trainable state -- what a checkpoint holds and travels to workers each
iteration -- is the adapter alone, keyed as diffusers' ``load_lora_weights`` reads it
(``transformer.<module>.lora_A.weight``); the KL reference is the same model with the adapter
disabled, not a second copy of the weights.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from spotlight.models.base import register_base, register_policy
from spotlight.models.qwen_image import sizing  # noqa: F401  (registers the --dry-run sizer)
from spotlight.models.qwen_image.weights import Components, load_components, resolve_dtype

PREFIX = "transformer."   # diffusers' LoRA state-dict prefix for the transformer's adapter


@register_policy("qwen-image")
def qwen_image_policy(config) -> "QwenImagePolicy":
    """``model.policy: qwen-image``: the components of ``model.weights``, adapter freshly
    initialised (a checkpoint's state then replaces it)."""
    components = load_components(config.model.weights, resolve_dtype(config.model.dtype))
    return QwenImagePolicy(components, config.model, *image_size(config))


def image_size(config) -> tuple[int, int]:
    """(height, width) of the images: model.height/width, else the world's canvas."""
    return (config.model.height or config.world.canvas_height,
            config.model.width or config.world.canvas_width)


@register_base("qwen-image")
def qwen_image_base(config, progress: bool = True) -> "QwenImagePolicy":
    """The base: the weights as loaded, with a fresh adapter (LoRA B = 0: the identity)."""
    return qwen_image_policy(config)


class QwenImagePolicy(nn.Module):
    """Implements :class:`spotlight.models.base.Policy` over QwenImage components."""

    def __init__(self, components: Components, model_config, height: int, width: int) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.vae_scale = 2 ** len(components.vae.temperal_downsample)
        _check_resolution(height, width, self.vae_scale)
        self.transformer, self.vae = components.transformer, components.vae
        self.text_encoder, self.tokenizer = components.text_encoder, components.tokenizer
        for module in (self.transformer, self.vae, self.text_encoder):
            module.requires_grad_(False)
        self.lora = model_config.lora_rank > 0
        if self.lora:
            _add_lora(self.transformer, model_config)
        self._prompt_cache: dict[str, torch.Tensor] = {}

    # --- shapes ----------------------------------------------------------------------------
    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // self.vae_scale, self.width // self.vae_scale

    @property
    def tokens_shape(self) -> tuple[int, int]:
        h, w = self.latent_hw
        return (h // 2) * (w // 2), self.vae.config.z_dim * 4

    # --- prompts ---------------------------------------------------------------------------
    @torch.no_grad()
    def prompt_embedding(self, prompt: str) -> torch.Tensor:
        """(tokens, dim) embedding of one prompt, as ``QwenImagePipeline.encode_prompt``
        computes it (template, text encoder's last hidden state, template prefix dropped)."""
        from spotlight.models.qwen_image.tiny import PROMPT_TEMPLATE, TEMPLATE_DROP

        cached = self._prompt_cache.get(prompt)
        if cached is None:
            tokens = self.tokenizer([PROMPT_TEMPLATE.format(prompt)], return_tensors="pt",
                                    truncation=True, max_length=1024 + TEMPLATE_DROP)
            out = self.text_encoder(input_ids=tokens.input_ids,
                                    attention_mask=tokens.attention_mask,
                                    output_hidden_states=True)
            cached = out.hidden_states[-1][0, TEMPLATE_DROP:].float()
            self._prompt_cache[prompt] = cached
        return cached

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded prompt embeddings (B, T, dim) and their mask (B, T)."""
        embs = [self.prompt_embedding(p) for p in prompts]
        length = max(e.shape[0] for e in embs)
        dtype = next(self.transformer.parameters()).dtype
        out = torch.zeros(len(embs), length, embs[0].shape[1], dtype=dtype)
        mask = torch.zeros(len(embs), length, dtype=torch.long)
        for i, e in enumerate(embs):
            out[i, :e.shape[0]], mask[i, :e.shape[0]] = e.to(dtype), 1
        return out, mask

    # --- denoising -------------------------------------------------------------------------
    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor,
                 text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        emb, mask = text
        h, w = self.latent_hw
        dtype = next(self.transformer.parameters()).dtype
        out = self.transformer(
            hidden_states=latents.to(dtype), encoder_hidden_states=emb,
            encoder_hidden_states_mask=mask,
            timestep=sigma.expand(latents.shape[0]).to(dtype),
            img_shapes=[[(1, h // 2, w // 2)]] * latents.shape[0], return_dict=False)[0]
        return out.to(latents.dtype)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Packed latents -> float32 pixels (B, 3, H, W) in [0, 1], as the pipeline decodes."""
        h, w = self.latent_hw
        z = self.vae.config.z_dim
        b = latents.shape[0]
        x = latents.detach().view(b, h // 2, w // 2, z, 2, 2).permute(0, 3, 1, 4, 2, 5)
        x = x.reshape(b, z, 1, h, w).to(self.vae.dtype)
        mean = torch.tensor(self.vae.config.latents_mean).view(1, z, 1, 1, 1).to(x.dtype)
        std = torch.tensor(self.vae.config.latents_std).view(1, z, 1, 1, 1).to(x.dtype)
        image = self.vae.decode(x * std + mean, return_dict=False)[0][:, :, 0]
        return ((image.float().clamp(-1, 1) + 1) / 2).cpu().numpy().astype(np.float32)

    # --- training state --------------------------------------------------------------------
    def trainable_parameters(self, which: str = "transformer") -> list[nn.Parameter]:
        if which != "transformer":
            raise ValueError(f"grpo.trainable = {which!r}: the qwen-image policy trains its "
                             "transformer only (the text encoder's embeddings are cached)")
        if self.lora:
            return [p for n, p in self.transformer.named_parameters() if "lora_" in n]
        return list(self.transformer.parameters())

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The trainable state: the LoRA adapter in diffusers' layout, or the transformer."""
        if self.lora:
            from peft.utils import get_peft_model_state_dict

            state = get_peft_model_state_dict(self.transformer)
        else:
            state = self.transformer.state_dict()
        return {PREFIX + k: v.detach().clone() for k, v in state.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> Any:  # type: ignore[override]
        foreign = [k for k in state if not k.startswith(PREFIX)]
        if foreign:
            raise KeyError(f"qwen-image state has keys outside '{PREFIX}': {foreign[:3]}; is it "
                           "a checkpoint of another policy?")
        inner = {k[len(PREFIX):]: v for k, v in state.items()}
        if not self.lora:
            return self.transformer.load_state_dict(inner, strict=strict)
        from peft.utils import set_peft_model_state_dict

        mine = set(self.state_dict())
        if strict and set(state) != mine:
            raise KeyError(f"LoRA state does not match this adapter: missing "
                           f"{sorted(mine - set(state))[:3]}, unexpected "
                           f"{sorted(set(state) - mine)[:3]} (model.lora_rank / lora_targets "
                           "must be those the checkpoint was trained with)")
        return set_peft_model_state_dict(self.transformer, inner)

    def reference(self) -> "nn.Module":
        """The KL reference: the base model -- this policy with its adapter disabled."""
        return _AdapterOff(self) if self.lora else copy.deepcopy(self).requires_grad_(False)


class _AdapterOff:
    """This policy's base model, by disabling its LoRA adapter around each call."""

    def __init__(self, policy: QwenImagePolicy) -> None:
        self.policy = policy

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy.encode(prompts)

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, text: Any) -> torch.Tensor:
        with adapter_disabled(self.policy.transformer):
            return self.policy.velocity(latents, sigma, text)


@contextmanager
def adapter_disabled(transformer: nn.Module) -> Iterator[None]:
    transformer.disable_adapters()
    try:
        yield
    finally:
        transformer.enable_adapters()


def _add_lora(transformer: nn.Module, model_config) -> None:
    """A peft LoRA adapter on the configured modules; an error if a target matches nothing."""
    from peft import LoraConfig

    names = [n for n, _ in transformer.named_modules()]
    unmatched = [t for t in model_config.lora_targets
                 if not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        raise ValueError(f"model.lora_targets {unmatched} match no module of the transformer; "
                         "targets are module names or suffixes such as 'to_q' or "
                         "'img_mlp.net.2'")
    rank = model_config.lora_rank
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=model_config.lora_alpha or rank,
                                       target_modules=list(model_config.lora_targets),
                                       init_lora_weights=True))


def _check_resolution(height: int, width: int, vae_scale: int) -> None:
    step = vae_scale * 2
    if height % step or width % step:
        raise ValueError(f"image size {height}x{width} cannot be packed: Qwen-Image needs height "
                         f"and width divisible by {step} (VAE downsampling {vae_scale} x 2x2 "
                         "patches); set world.canvas_height / canvas_width")
