"""What the RL needs from a model, whatever the model: the ``Policy`` protocol and its registry.

The driver, the workers, the sampler, the trainer and the audit use a policy only through
this interface, and build it by the name in ``model.policy``; a new model is a class that
implements it and one ``@register_policy("name")`` builder -- nothing in ``pipelines/`` or
``storage/`` changes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class PolicySpec:
    """Everything Spotlight knows of one model, registered under its ``model.policy`` name.
    Only ``build`` is required; each other part has a default its reader names."""

    name: str
    build: PolicyBuilder | None = None   # RunConfig -> a policy with freshly built weights
    prompt_store: bool = False   # prompt embeddings kept in the run store (see ``Policy``)
    base: BaseBuilder | None = None   # checkpoint 0 (default: build's weights)
    decoder: Callable[[Any], Callable[[np.ndarray], np.ndarray]] | None = None
    """RunConfig -> (stored latent -> (H, W, 3) image in [0, 1]); default: the audit shows none."""
    check: Callable[[Any], None] | None = None   # what can fail, before any worker starts
    sizer: Callable[[Any], Any] | None = None   # RunConfig -> ModelSize (``--dry-run``)


POLICIES: dict[str, PolicySpec] = {}
"""The registered models by name. A model's parts may be registered from several modules (its
heavy dependencies imported only where used); each registration fills in its part."""

# Modules that register the policies shipped with Spotlight; imported on first use so that
# naming a policy does not import every model's dependencies.
_SHIPPED = {"digits": ("spotlight.models.pretrain",),   # the policy, and its pretrained base
            "qwen-image": ("spotlight.models.qwen_image.policy",
                           "spotlight.models.qwen_image.check",
                           "spotlight.models.qwen_image.sizing"),
            "sd3.5": ("spotlight.models.sd35.policy", "spotlight.models.sd35.check",
                      "spotlight.models.sd35.sizing")}


def _fill(name: str, part: str, value: Any) -> None:
    spec = POLICIES.get(name) or PolicySpec(name)
    held = getattr(spec, part)
    if part == "build" and held is not None and held is not value:
        raise ValueError(f"policy '{name}' is registered twice ({held!r} and {value!r}); pick "
                         "another name")
    POLICIES[name] = replace(spec, **{part: value})


def register_policy(name: str, *, prompt_store: bool = False
                    ) -> Callable[[PolicyBuilder], PolicyBuilder]:
    """Decorator: ``build_policy`` calls the builder with the run config for ``model.policy``.
    ``prompt_store``: the policy's prompt embeddings go to the run store (see ``Policy``)."""

    def add(builder: PolicyBuilder) -> PolicyBuilder:
        _fill(name, "build", builder)
        _fill(name, "prompt_store", prompt_store)
        return builder

    return add


def _registrar(part: str) -> Callable[[str], Callable]:
    """A decorator factory: ``@register(name)`` files the decorated function as ``part`` of the
    policy ``name``."""

    def register(name: str) -> Callable:
        def add(function: Callable) -> Callable:
            _fill(name, part, function)
            return function

        return add

    return register


register_base = _registrar("base")         # base_policy's (default: build_policy's weights)
register_decoder = _registrar("decoder")   # latent_decoder's (default: the audit shows no image)
register_check = _registrar("check")       # check_policy's (default: nothing to check)
register_sizing = _registrar("sizer")      # model_size's (default: none; --dry-run refuses)


def policy_spec(name: str) -> PolicySpec:
    """The registered model ``name`` (its shipped modules imported first); a clear error
    naming the choices when there is none."""
    import importlib  # the shipped modules are named, not imported, until a run needs one

    for module in _SHIPPED.get(name, ()):   # every part of the name, whichever came first
        importlib.import_module(module)
    spec = POLICIES.get(name)
    if spec is None or spec.build is None:
        raise ValueError(f"model.policy = {name!r} is not a registered policy; choose one of "
                         f"{sorted(set(POLICIES) | set(_SHIPPED))}, or register yours with "
                         "@register_policy")
    return spec


def latent_decoder(config: Any) -> Callable[[np.ndarray], np.ndarray] | None:
    """How the audit turns a stored latent of ``config``'s policy into pixels (None: unknown)."""
    decoder = policy_spec(config.model.policy).decoder
    return decoder(config) if decoder is not None else None


def check_policy(config: Any) -> None:
    """Everything about ``config``'s model that can fail, checked before a cluster starts or a
    run store is created (weights folder, dtype, resolution, adapter targets)."""
    check = policy_spec(config.model.policy).check
    if check is not None:
        check(config)


def model_size(config: Any) -> Any:
    """The :class:`spotlight.sizing.ModelSize` of ``config``'s policy (nothing loaded)."""
    spec = policy_spec(config.model.policy)
    if spec.sizer is None:
        raise ValueError(f"policy {spec.name!r} cannot size itself for --dry-run; register a "
                         "sizer with @register_sizing")
    return spec.sizer(config)


def stores_prompts(config: Any) -> bool:
    """Whether ``config``'s policy keeps its prompt embeddings in the run store."""
    return policy_spec(config.model.policy).prompt_store


def build_policy(config: Any) -> Policy:
    """The policy ``config.model.policy`` names, built for ``config`` (a worker then loads a
    checkpoint's trainable state into it)."""
    return policy_spec(config.model.policy).build(config)


def base_policy(config: Any, progress: bool = True) -> Policy:
    """The base model of ``config`` -- what a run's checkpoint 0 holds: pretrained (digits,
    cached), or loaded from its weights with a fresh adapter (qwen-image, sd3.5)."""
    spec = policy_spec(config.model.policy)
    return spec.base(config, progress) if spec.base is not None else spec.build(config)
