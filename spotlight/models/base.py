"""What the RL needs from a model, whatever the model: the ``Policy`` protocol and its registry.

The driver, the workers, the sampler, the trainer and the audit use a policy only through
this interface, and build it by the name in ``model.policy``; a new model is a class that
implements it and one ``@register_policy("name")`` builder -- nothing in ``pipelines/`` or
``storage/`` changes.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

TextConditioning = Any   # whatever ``encode`` returns and ``velocity`` takes back


@runtime_checkable
class Policy(Protocol):
    """A denoiser over packed latents, conditioned on prompts (an ``nn.Module``)."""

    @property
    def tokens_shape(self) -> tuple[int, int]:
        """(tokens, channels) of one packed latent: the shape noise is drawn in."""
        ...

    def encode(self, prompts: list[str]) -> TextConditioning:
        """Prompt conditioning, computed once per batch and passed to every ``velocity``."""
        ...

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor,
                 text: TextConditioning) -> torch.Tensor:
        """Predicted flow velocity (noise - data) of ``latents`` (B, tokens, channels) at noise
        level ``sigma`` (a one-element tensor)."""
        ...

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Packed latents -> float32 pixels (B, 3, H, W) in [0, 1], what rewards score."""
        ...

    def trainable_parameters(self, which: str = "transformer") -> list[nn.Parameter]:
        """The parameters an update changes (``grpo.trainable``)."""
        ...

    def reference(self) -> Any:
        """The frozen KL reference (``encode`` and ``velocity`` of the weights as they are now):
        a copy, or -- for an adapter -- this policy with its adapter disabled."""
        ...

    def state_dict(self) -> Mapping[str, torch.Tensor]:
        """The trainable state a checkpoint holds and a worker loads (by weights version)."""
        ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> Any:
        ...

    def train(self, mode: bool = True) -> Any:
        ...

    # Optional, for policies whose prompt conditioning is costly (a large text encoder): those
    # registered with ``prompt_store=True`` implement
    #   use_prompt_store(lookup, save)  read embeddings through ``lookup(prompt)`` (None: not
    #                                   stored), ``save(prompt, array)`` each one computed;
    #   text_encoder_loaded             whether this process has loaded the text encoder.
    # And with ``sampler.schedule: model``: sigma_schedule(num_steps) -> num_steps + 1 sigmas.

    def eval(self) -> Any:
        ...


PolicyBuilder = Callable[[Any], Policy]   # RunConfig -> a policy with freshly built weights
BaseBuilder = Callable[[Any, bool], Policy]   # (RunConfig, progress) -> the base model
POLICIES: dict[str, PolicyBuilder] = {}
"""Registered policy builders by name (``model.policy``)."""
BASES: dict[str, BaseBuilder] = {}
"""How each registered policy gets its base weights (checkpoint 0 of a run)."""
PROMPT_STORE: set[str] = set()
"""Policies whose prompt embeddings are kept in the run store (computed once, on a gpu worker)."""
DECODERS: dict[str, Callable[[Any], Callable[[np.ndarray], np.ndarray]]] = {}
"""RunConfig -> (stored latent -> (H, W, 3) image in [0, 1]): how the audit shows a latent."""
CHECKS: dict[str, Callable[[Any], None]] = {}
"""RunConfig -> None or a clear error: what the policy can check before any worker starts."""
SIZERS: dict[str, Callable[[Any], Any]] = {}
"""RunConfig -> spotlight.sizing.ModelSize, without loading weights (``--dry-run``)."""

# Modules that register the policies shipped with Spotlight; imported on first use so that
# naming a policy does not import every model's dependencies.
_SHIPPED = {"digits": ("spotlight.models.pretrain",),   # the policy, and its pretrained base
            "qwen-image": ("spotlight.models.qwen_image.policy",
                           "spotlight.models.qwen_image.check",
                           "spotlight.models.qwen_image.sizing")}


def register_policy(name: str, *, prompt_store: bool = False
                    ) -> Callable[[PolicyBuilder], PolicyBuilder]:
    """Decorator: ``build_policy`` calls the builder with the run config for ``model.policy``.
    ``prompt_store``: the policy's prompt embeddings go to the run store (see ``Policy``)."""

    def add(builder: PolicyBuilder) -> PolicyBuilder:
        if name in POLICIES and POLICIES[name] is not builder:
            raise ValueError(f"policy '{name}' is registered twice ({POLICIES[name]!r} and "
                             f"{builder!r}); pick another name")
        POLICIES[name] = builder
        if prompt_store:
            PROMPT_STORE.add(name)
        return builder

    return add


def _registrar(table: dict[str, Callable]) -> Callable[[str], Callable]:
    """A decorator factory: ``@register(name)`` files the decorated function under the policy
    ``name`` in ``table`` (a policy without an entry gets the default the table's reader names)."""

    def register(name: str) -> Callable:
        def add(function: Callable) -> Callable:
            table[name] = function
            return function

        return add

    return register


register_base = _registrar(BASES)         # base_policy's (default: build_policy's weights)
register_decoder = _registrar(DECODERS)   # latent_decoder's (default: the audit shows no image)
register_check = _registrar(CHECKS)       # check_policy's (default: nothing to check)
register_sizing = _registrar(SIZERS)      # model_size's (default: none; --dry-run refuses)


def latent_decoder(config: Any) -> Callable[[np.ndarray], np.ndarray] | None:
    """How the audit turns a stored latent of ``config``'s policy into pixels (None: unknown)."""
    _registered(config.model.policy)
    builder = DECODERS.get(config.model.policy)
    return builder(config) if builder is not None else None


def check_policy(config: Any) -> None:
    """Everything about ``config``'s model that can fail, checked before a cluster starts or a
    run store is created (weights folder, dtype, resolution, adapter targets)."""
    _registered(config.model.policy)
    check = CHECKS.get(config.model.policy)
    if check is not None:
        check(config)


def model_size(config: Any) -> Any:
    """The :class:`spotlight.sizing.ModelSize` of ``config``'s policy (nothing loaded)."""
    name = config.model.policy
    _registered(name)
    if name not in SIZERS:
        raise ValueError(f"policy {name!r} cannot size itself for --dry-run; register a sizer "
                         "with @register_sizing")
    return SIZERS[name](config)


def _registered(name: str) -> None:
    import importlib

    for module in _SHIPPED.get(name, ()):   # every registry of the name, whichever came first
        importlib.import_module(module)
    if name not in POLICIES:
        raise ValueError(f"model.policy = {name!r} is not a registered policy; choose one of "
                         f"{sorted(set(POLICIES) | set(_SHIPPED))}, or register yours with "
                         "@register_policy")


def stores_prompts(config: Any) -> bool:
    """Whether ``config``'s policy keeps its prompt embeddings in the run store."""
    _registered(config.model.policy)
    return config.model.policy in PROMPT_STORE


def build_policy(config: Any) -> Policy:
    """The policy ``config.model.policy`` names, built for ``config`` (a worker then loads a
    checkpoint's trainable state into it)."""
    _registered(config.model.policy)
    return POLICIES[config.model.policy](config)


def base_policy(config: Any, progress: bool = True) -> Policy:
    """The base model of ``config`` -- what a run's checkpoint 0 holds: pretrained (digits,
    cached), or loaded from its weights with a fresh adapter (qwen-image)."""
    name = config.model.policy
    _registered(name)
    builder = BASES.get(name)
    return builder(config, progress) if builder is not None else POLICIES[name](config)
