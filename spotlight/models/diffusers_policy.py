"""The half of a :class:`spotlight.models.base.Policy` that every diffusers transformer + VAE model
shares: freezing the components, the peft LoRA adapter on the transformer, placement on one
device, prompt embeddings remembered and read from (or written to) the run store, the sigma
schedule cached per step count, the trainable state, and the KL reference.

A model's policy subclasses :class:`DiffusersPolicy` and adds what is its own: latent shapes,
how a prompt is embedded (``embed_prompt``), the transformer call (``velocity``), the VAE decode
and its scheduler's sigmas (``model_sigmas``).

With LoRA the trainable state -- what a checkpoint holds and travels to workers each
iteration -- is the adapter alone, keyed as diffusers' ``load_lora_weights`` reads it
(``transformer.<module>.lora_A.weight``); the KL reference is the same model with the adapter
disabled, not a second copy of the weights.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from spotlight.models.device import module_device, place
from spotlight.models.diffusers_parts import add_lora, lora_targets

PREFIX = "transformer."  # diffusers' LoRA state-dict prefix for the transformer's adapter


class DiffusersPolicy(nn.Module):
    """A transformer (trained, through a LoRA adapter by default) and a VAE on one device, for
    images of ``height`` x ``width`` that the VAE downsamples ``vae_scale`` times a side."""

    name = ""  # model.policy, as errors name it
    own_lora_targets: tuple[str, ...] = ()  # for model.lora_targets left at its default
    lora_example = "'to_q'"  # a target, as the error for an unmatched one shows

    def __init__(
        self,
        components: Any,
        model_config: Any,
        height: int,
        width: int,
        vae_scale: int,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.height, self.width, self.vae_scale = height, width, vae_scale
        self.components = components  # the model's loaded parts: transformer, vae, folder, ...
        self.transformer, self.vae = components.transformer, components.vae
        for module in (self.transformer, self.vae):
            module.requires_grad_(False)
        self.lora = model_config.lora_rank > 0
        if self.lora:
            targets = lora_targets(model_config, self.own_lora_targets)
            add_lora(self.transformer, model_config, targets, self.lora_example)
        if model_config.gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing()
        # Every module, the adapter included, on the one device every step computes on.
        self.device = (
            torch.device(device) if device is not None else module_device(self.transformer)
        )
        for module in (self.transformer, self.vae):
            place(module, self.device)
        self.true_cfg, self.negative_prompt = model_config.true_cfg, model_config.negative_prompt
        self._prompt_cache: dict[str, torch.Tensor] = {}
        self._prompt_store: Callable[[str], np.ndarray | None] | None = None
        self._prompt_save: Callable[[str, np.ndarray], None] | None = None
        self._sigmas: dict[int, torch.Tensor] = {}

    @property
    def _dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    @property
    def latent_hw(self) -> tuple[int, int]:
        """(height, width) of the VAE's latents of one image."""
        return self.height // self.vae_scale, self.width // self.vae_scale

    # --- prompts ---------------------------------------------------------------------------
    def embed_prompt(self, prompt: str) -> np.ndarray:
        """One prompt's conditioning as one float32 array (what the run store keeps)."""
        raise NotImplementedError

    def use_prompt_store(
        self,
        lookup: Callable[[str], np.ndarray | None],
        save: Callable[[str, np.ndarray], None] | None = None,
    ) -> None:
        """Read prompt embeddings through ``lookup`` (prompt -> array, or None) before computing
        one, and ``save`` each one computed: a worker whose prompts are all stored never loads
        a text encoder."""
        self._prompt_store, self._prompt_save = lookup, save

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

    # --- sampling --------------------------------------------------------------------------
    def model_sigmas(self, num_steps: int) -> torch.Tensor:
        """The model's pipeline's ``num_steps + 1`` sigmas at this resolution."""
        raise NotImplementedError

    def sigma_schedule(self, num_steps: int) -> torch.Tensor:
        """The pipeline's sigmas for ``num_steps`` (``sampler.schedule: model``), computed once
        per step count."""
        if num_steps not in self._sigmas:
            self._sigmas[num_steps] = self.model_sigmas(num_steps)
        return self._sigmas[num_steps].clone()

    # --- training state --------------------------------------------------------------------
    def trainable_parameters(self, which: str = "transformer") -> list[nn.Parameter]:
        if which != "transformer":
            raise ValueError(
                f"grpo.trainable = {which!r}: the {self.name} policy trains its transformer "
                "only (the text encoders' embeddings are cached)"
            )
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
            raise KeyError(
                f"{self.name} state has keys outside '{PREFIX}': {foreign[:3]}; is it a "
                "checkpoint of another policy?"
            )
        inner = {k[len(PREFIX) :]: v for k, v in state.items()}
        if not self.lora:
            return self.transformer.load_state_dict(inner, strict=strict)
        from peft.utils import set_peft_model_state_dict

        mine = set(self.state_dict())
        if strict and set(state) != mine:
            raise KeyError(
                f"LoRA state does not match this adapter: missing {sorted(mine - set(state))[:3]}"
                f", unexpected {sorted(set(state) - mine)[:3]} (model.lora_rank / lora_targets "
                "must be those the checkpoint was trained with)"
            )
        return set_peft_model_state_dict(self.transformer, inner)

    def reference(self) -> Any:
        """The KL reference: the base model -- this policy with its adapter disabled."""
        return AdapterOff(self) if self.lora else copy.deepcopy(self).requires_grad_(False)


class AdapterOff:
    """A policy's base model, by disabling its LoRA adapter around each call."""

    def __init__(self, policy: DiffusersPolicy) -> None:
        self.policy = policy

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def encode(self, prompts: list[str]) -> Any:
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
