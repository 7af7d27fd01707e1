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
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np
import torch
from torch import nn

from spotlight.models.base import register_base, register_decoder, register_policy
from spotlight.models.device import autocast, module_device, place, resolve_device, to_device
from spotlight.models.qwen_image.template import PROMPT_TEMPLATE, TEMPLATE_DROP
from spotlight.models.qwen_image.weights import (
    Components,
    load_components,
    local_folder,
    resolve_dtype,
    scheduler_sigmas,
)

PREFIX = "transformer."   # diffusers' LoRA state-dict prefix for the transformer's adapter


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


def placement_dtype(name: str, device: torch.device) -> torch.dtype:
    """``model.dtype`` for weights on ``device``: 'auto' is bfloat16 on a CUDA device (as the
    published weights are), float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return resolve_dtype(name)


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

    def __init__(self, components: Components, model_config, height: int, width: int,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.vae_scale = 2 ** len(components.vae.temperal_downsample)
        check_resolution(height, width, self.vae_scale)
        self.transformer, self.vae = components.transformer, components.vae
        self.components = components
        for module in (self.transformer, self.vae):
            module.requires_grad_(False)
        self.lora = model_config.lora_rank > 0
        if self.lora:
            _add_lora(self.transformer, model_config)
        if model_config.gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing()
        # Every module, the adapter included, on the one device every step computes on.
        self.device = torch.device(device) if device is not None else \
            module_device(self.transformer)
        for module in (self.transformer, self.vae):
            place(module, self.device)
        self.true_cfg, self.negative_prompt = model_config.true_cfg, model_config.negative_prompt
        self._prompt_cache: dict[str, torch.Tensor] = {}
        self._prompt_store: Callable[[str], np.ndarray | None] | None = None
        self._prompt_save: Callable[[str, np.ndarray], None] | None = None
        self._sigmas: dict[int, torch.Tensor] = {}

    # --- shapes ----------------------------------------------------------------------------
    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // self.vae_scale, self.width // self.vae_scale

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

    def use_prompt_store(self, lookup: Callable[[str], np.ndarray | None],
                         save: Callable[[str, np.ndarray], None] | None = None) -> None:
        """Read prompt embeddings through ``lookup`` (prompt -> (tokens, dim) array, or None)
        before computing one, and ``save`` each one computed: a worker whose prompts are all
        stored never loads the text encoder."""
        self._prompt_store, self._prompt_save = lookup, save

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

    def prompt_embedding(self, prompt: str) -> torch.Tensor:
        """One prompt's embedding: remembered, else from the prompt store, else computed."""
        cached = self._prompt_cache.get(prompt)
        if cached is None:
            stored = self._prompt_store(prompt) if self._prompt_store is not None else None
            if stored is None:
                stored = self.embed_prompt(prompt)
                if self._prompt_save is not None:
                    self._prompt_save(prompt, stored)
            cached = self._prompt_cache[prompt] = torch.from_numpy(np.asarray(stored, np.float32))
        return cached

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

    @property
    def _dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def sigma_schedule(self, num_steps: int) -> torch.Tensor:
        """The pipeline's sigmas for ``num_steps`` at this resolution (``sampler.schedule:
        model``): the weights' FlowMatchEulerDiscreteScheduler with its dynamic shift."""
        if num_steps not in self._sigmas:
            self._sigmas[num_steps] = scheduler_sigmas(self.components.folder, num_steps,
                                                       self.tokens_shape[0])
        return self._sigmas[num_steps].clone()

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
    image = vae.decode(x * std + mean, return_dict=False)[0][:, :, 0]
    return ((image.float().clamp(-1, 1) + 1) / 2).cpu().numpy().astype(np.float32)


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

    def decode(latent: np.ndarray) -> np.ndarray:
        tokens = torch.from_numpy(np.asarray(latent, np.float32))
        pixels = vae_decode(vae, tokens.reshape(-1, *tokens.shape[-2:]),
                            (height // scale, width // scale))
        return np.concatenate(list(pixels.transpose(0, 2, 3, 1)), axis=0)

    return decode


class _AdapterOff:
    """This policy's base model, by disabling its LoRA adapter around each call."""

    def __init__(self, policy: QwenImagePolicy) -> None:
        self.policy = policy

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def encode(self, prompts: list[str]) -> "Conditioning":
        return self.policy.encode(prompts)

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, text: Any) -> torch.Tensor:
        with adapter_disabled(self.policy.transformer):
            return self.policy.velocity(latents, sigma, text)


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


@contextmanager
def adapter_disabled(transformer: nn.Module) -> Iterator[None]:
    transformer.disable_adapters()
    try:
        yield
    finally:
        transformer.enable_adapters()


def check_lora_targets(transformer: nn.Module, targets: list[str]) -> None:
    """An error naming every LoRA target that matches no module of ``transformer``."""
    names = [n for n, _ in transformer.named_modules()]
    unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        raise ValueError(f"model.lora_targets {unmatched} match no module of the transformer; "
                         "targets are module names or suffixes such as 'to_q' or "
                         "'img_mlp.net.2'")


def _add_lora(transformer: nn.Module, model_config) -> None:
    """A peft LoRA adapter on the configured modules; an error if a target matches nothing."""
    from peft import LoraConfig

    check_lora_targets(transformer, model_config.lora_targets)
    rank = model_config.lora_rank
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=model_config.lora_alpha or rank,
                                       target_modules=list(model_config.lora_targets),
                                       init_lora_weights=True))


def check_resolution(height: int, width: int, vae_scale: int) -> None:
    step = vae_scale * 2
    if height % step or width % step:
        raise ValueError(f"image size {height}x{width} cannot be packed: Qwen-Image needs height "
                         f"and width divisible by {step} (VAE downsampling {vae_scale} x 2x2 "
                         "patches); set world.canvas_height / canvas_width")
