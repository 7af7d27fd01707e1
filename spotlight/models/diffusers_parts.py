"""What the diffusers-based policies (``qwen-image``, ``sd3.5``) share, apart from the policy class
itself (:mod:`spotlight.models.diffusers_policy`): where a weights folder comes from, the dtype
its weights are placed in, the image size, and the peft LoRA adapter on the transformer -- its
targets, and its parameters counted without loading anything.

A model describes its weights folder once, as a :class:`WeightsLayout`; resolving ``model.weights``
(a local folder, an object-storage URL copied once into the cache, a Hub id, or ``tiny``) is the
same for every model. (Resolving it needs no torch: ``torch`` is imported here for type names
and used only in the functions that load, count or place weights.)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from spotlight.config import PROJECT_ROOT
from spotlight.models.hub import hub_folder, parse_hub_id
from spotlight.staging import StagingError, cache_root, publish, staged_folder

TINY = "tiny"  # model.weights: tiny random components, built offline into the cache


class WeightsError(StagingError):
    """A weights folder or URL that cannot give a policy its components."""


@dataclass(frozen=True)
class WeightsLayout:
    """A model's weights folder in diffusers' layout: one subfolder per component beside
    ``model_index.json``, each as its library's ``save_pretrained`` wrote it."""

    model: str  # the model's name in errors: "Qwen-Image"
    required: Mapping[str, str]  # component folder -> the file that shows it is there
    hub_example: str  # a Hub id the errors show: "Qwen/Qwen-Image"
    tiny_cache: str  # the cache folder of the tiny components (versioned: bump on change)
    build_tiny: Callable[[Path], Path]  # writes tiny random components into a folder


def resolve_dtype(name: str) -> torch.dtype:
    """``model.dtype`` as a torch dtype; an error for one this machine cannot run."""
    gpu = torch.cuda.is_available()
    if name == "auto":
        return torch.bfloat16 if gpu else torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        name
    )
    if dtype is None:
        raise WeightsError(f"model.dtype = {name!r}; expected auto, float32, bfloat16 or float16")
    if dtype is torch.float16 and not gpu:
        raise WeightsError(
            "model.dtype = 'float16' needs a GPU (CPU kernels lack half "
            "precision for these models); use 'auto', 'float32' or 'bfloat16'"
        )
    return dtype


def placement_dtype(name: str, device: torch.device) -> torch.dtype:
    """``model.dtype`` for weights on ``device``: 'auto' is bfloat16 on a CUDA device (as the
    published weights are), float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return resolve_dtype(name)


def sized_weight_bytes(model_config: Any) -> int:
    """Bytes of one weight as a GPU worker would hold it: 'auto' is bfloat16 there (the dry run
    sizes GPU workers), but the tiny components size as this machine runs them."""
    if model_config.dtype == "auto" and model_config.weights != TINY:
        return 2
    return torch.tensor([], dtype=resolve_dtype(model_config.dtype)).element_size()


def image_size(config: Any) -> tuple[int, int]:
    """(height, width) of the images: model.height/width, else the world's canvas."""
    return (
        config.model.height or config.world.canvas_height,
        config.model.width or config.world.canvas_width,
    )


def check_resolution(model: str, height: int, width: int, step: int, why: str) -> None:
    """An error unless both sides are multiples of ``step`` (``why`` says where it comes from)."""
    if height % step or width % step:
        raise ValueError(
            f"image size {height}x{width} cannot be packed: {model} needs height and width "
            f"divisible by {step} ({why}); set world.canvas_height / canvas_width (or "
            "model.height / model.width)"
        )


# --- the weights folder ----------------------------------------------------------------------
def local_folder(layout: WeightsLayout, weights: str, configs_only: bool = False) -> Path:
    """A local folder holding the components of ``weights`` (a path, a URL, a Hub id or
    ``tiny``); with ``configs_only`` a Hub id fetches only their JSON files (what a check reads)."""
    if weights == TINY:
        return tiny_folder(layout)
    check = functools.partial(check_folder, layout)
    hub = parse_hub_id(weights)  # a folder of the same name wins
    if hub is not None:
        return hub_folder(*hub, weights, list(layout.required), check, configs_only)
    try:
        return staged_folder(weights, "model.weights", check)
    except WeightsError:
        raise
    except StagingError as err:
        raise WeightsError(
            f"{err}; expected a {layout.model} weights folder with "
            f"{sorted(layout.required)} (or a Hub id, or 'tiny')"
        ) from None


def checked_folder(layout: WeightsLayout, model_config: Any) -> Path:
    """What a pre-run check reads: ``model.dtype`` checked, then the folder of ``model.weights``
    (a missing component named; a URL copied once; of a Hub id, only the config files)."""
    resolve_dtype(model_config.dtype)
    return local_folder(layout, model_config.weights, configs_only=True)


def check_folder(layout: WeightsLayout, folder: Path, named: str) -> None:
    """An error naming every missing component and what was expected, before any load."""
    if not folder.is_dir():
        raise WeightsError(
            f"model.weights {named!r}: no such folder; expected a {layout.model} weights "
            f"folder with {sorted(layout.required)}, a Hub id such as "
            f"{layout.hub_example}[@revision], or 'tiny'"
        )
    missing = [
        f"{name}/{marker}"
        for name, marker in layout.required.items()
        if not (folder / name / marker).is_file()
    ]
    if missing:
        raise WeightsError(
            f"model.weights {named!r} lacks {missing}; a {layout.model} weights folder holds "
            f"{sorted(layout.required)} as save_pretrained writes them"
        )


def tiny_folder(layout: WeightsLayout) -> Path:
    """The tiny components, built once into the cache (atomically: a half-built folder never
    counts)."""
    folder = cache_root() / layout.tiny_cache
    if not (folder / "model_index.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        layout.build_tiny(building)
        publish(building, folder, "model_index.json")
    return folder


def sizing_folder(layout: WeightsLayout, weights: str) -> Path | None:
    """The local folder whose configs the dry run sizes; None where the weights are not on this
    machine (a URL, a Hub id): the model's published configs stand in, and nothing is fetched."""
    if weights == TINY:
        return tiny_folder(layout)
    path = Path(weights.removeprefix("file://")).expanduser()
    return path if "://" not in weights.removeprefix("file://") and path.is_dir() else None


def component_config(folder: Path, component: str) -> dict:
    """The ``config.json`` of one component of a weights folder (no weight is read)."""
    return json.loads((folder / component / "config.json").read_text())


def scheduler_sigmas(folder: Path, **set_timesteps: Any) -> torch.Tensor:
    """The sigmas of the folder's ``FlowMatchEulerDiscreteScheduler`` after
    ``set_timesteps(**set_timesteps)``, as its pipeline sets them (the final 0 included)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(folder / "scheduler")
    scheduler.set_timesteps(**set_timesteps)
    return scheduler.sigmas.detach().float().cpu()


def tiny_corpus() -> list[str]:
    """Text the tiny tokenizers learn their vocabularies from: the shipped prompt files, and the
    digits (a tokenizer without them would read every number as unknown)."""
    lines = []
    for path in sorted((PROJECT_ROOT / "configs" / "prompts").glob("*.txt")):
        lines += path.read_text().splitlines()
    return lines + ["a photo of text that says 0 1 2 3 4 5 6 7 8 9"]


# --- the LoRA adapter --------------------------------------------------------------------------
def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def lora_targets(model_config: Any, own: tuple[str, ...] = ()) -> list[str]:
    """``model.lora_targets``; for a model with targets of its ``own``, those where the config
    leaves the field at its shipped default -- Qwen-Image's module names, which another
    transformer may not have. (The default stays as it is: it keys cached base models.)"""
    targets = list(model_config.lora_targets)
    shipped = {f.name: f for f in dataclasses.fields(model_config)}["lora_targets"]
    if own and targets == shipped.default_factory():
        return list(own)
    return targets


def _targeted(name: str, targets: list[str]) -> bool:
    """Whether module ``name`` is a LoRA target, as peft matches ``target_modules``: the whole
    name, or a suffix after a dot."""
    return any(name == t or name.endswith("." + t) for t in targets)


def check_lora_targets(transformer: torch.nn.Module, targets: list[str], example: str) -> None:
    """An error naming every LoRA target that matches no module of ``transformer``."""
    names = [n for n, _ in transformer.named_modules()]
    unmatched = [t for t in targets if not any(_targeted(n, [t]) for n in names)]
    if unmatched:
        raise ValueError(
            f"model.lora_targets {unmatched} match no module of the transformer; targets are "
            f"module names or suffixes such as {example}"
        )


def check_adapter_targets(
    transformer_class: Any,
    transformer_config: dict,
    model_config: Any,
    own: tuple[str, ...],
    example: str,
) -> None:
    """``model.lora_targets`` (or the model's ``own``, see :func:`lora_targets`) against the
    transformer built on the meta device from its config: no weight is loaded. Nothing to check
    without an adapter."""
    if model_config.lora_rank == 0:
        return
    with torch.device("meta"):
        transformer = transformer_class.from_config(transformer_config)
    check_lora_targets(transformer, lora_targets(model_config, own), example)


def lora_parameter_count(transformer: torch.nn.Module, rank: int, targets: list[str]) -> int:
    """r x (in + out) for every linear layer a LoRA target names (on the meta device: nothing is
    allocated)."""
    return sum(
        rank * (module.in_features + module.out_features)
        for name, module in transformer.named_modules()
        if isinstance(module, torch.nn.Linear) and _targeted(name, targets)
    )


def add_lora(
    transformer: torch.nn.Module, model_config: Any, targets: list[str], example: str
) -> None:
    """A peft LoRA adapter on ``targets``, B = 0 (the identity until trained); an error if a
    target matches nothing."""
    from peft import LoraConfig

    check_lora_targets(transformer, targets, example)
    rank = model_config.lora_rank
    transformer.add_adapter(
        LoraConfig(
            r=rank,
            lora_alpha=model_config.lora_alpha or rank,
            target_modules=targets,
            init_lora_weights=True,
        )
    )


# --- pixels ------------------------------------------------------------------------------------
def unit_pixels(image: torch.Tensor) -> np.ndarray:
    """A VAE's output in [-1, 1] -> float32 pixels in [0, 1] on the host, as the pipelines'
    image processors denormalise it."""
    return ((image.float().clamp(-1, 1) + 1) / 2).cpu().numpy().astype(np.float32)


def stacked_images(
    decode_batch: Callable[[torch.Tensor], np.ndarray],
) -> Callable[[np.ndarray], np.ndarray]:
    """For the audit: a stored latent (tokens, channels) or a batch of them (B, tokens, channels)
    -> its images stacked top to bottom (H, W, 3), through ``decode_batch`` (latents -> pixels
    (B, 3, H, W))."""

    def decode(latent: np.ndarray) -> np.ndarray:
        tokens = torch.from_numpy(np.asarray(latent, np.float32))
        pixels = decode_batch(tokens.reshape(-1, *tokens.shape[-2:]))
        return np.concatenate(list(pixels.transpose(0, 2, 3, 1)), axis=0)

    return decode
