"""Where a Qwen-Image policy's components come from: a local folder, an object-storage URL
(copied once to a local cache through fsspec and checksummed), a Hugging Face Hub id such as
``Qwen/Qwen-Image[@revision]`` (fetched once per machine into the Hub cache and checksummed: see
:mod:`.hub`), or ``tiny`` (tiny random components built offline into the cache, then loaded
exactly like real weights).

A folder has diffusers' layout: ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``
(and ``scheduler/``, ``model_index.json``), each as its library's ``save_pretrained`` wrote it.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotlight.models.qwen_image.hub import hub_folder, parse_hub_id
from spotlight.staging import StagingError, cache_root, publish, staged_folder

# Component folder -> the file that shows it is there (what save_pretrained writes first).
REQUIRED = {"transformer": "config.json", "vae": "config.json", "text_encoder": "config.json",
            "tokenizer": "tokenizer_config.json", "scheduler": "scheduler_config.json"}
TINY = "tiny"
TINY_VERSION = 2                       # bump when the tiny components change


class WeightsError(StagingError):
    """A weights folder or URL that cannot give a Qwen-Image policy its components."""


@dataclass
class Components:
    """The loaded components; the text encoder and tokenizer are ``None`` until needed (a worker
    that reads prompt embeddings from the run store never loads them)."""

    transformer: Any
    vae: Any
    folder: Path
    dtype: torch.dtype
    text_encoder: Any = None
    tokenizer: Any = None

    def load_text_encoder(self) -> None:
        if self.text_encoder is None:
            self.text_encoder, self.tokenizer = load_text_encoder(self.folder, self.dtype)


def resolve_dtype(name: str) -> torch.dtype:
    """``model.dtype`` as a torch dtype; an error for one this machine cannot run."""
    gpu = torch.cuda.is_available()
    if name == "auto":
        return torch.bfloat16 if gpu else torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}.get(name)
    if dtype is None:
        raise WeightsError(f"model.dtype = {name!r}; expected auto, float32, bfloat16 or float16")
    if dtype is torch.float16 and not gpu:
        raise WeightsError("model.dtype = 'float16' needs a GPU (CPU kernels lack half "
                           "precision for these models); use 'auto', 'float32' or 'bfloat16'")
    return dtype


def local_folder(weights: str, configs_only: bool = False) -> Path:
    """A local folder holding the components of ``weights`` (a path, a URL, a Hub id or
    ``tiny``); with ``configs_only`` a Hub id fetches only their JSON files (what a check reads)."""
    if weights == TINY:
        return _tiny_folder()
    hub = parse_hub_id(weights)          # a folder of the same name wins
    if hub is not None:
        return hub_folder(*hub, weights, list(REQUIRED), check_folder, configs_only)
    try:
        return staged_folder(weights, "model.weights", check_folder)
    except WeightsError:
        raise
    except StagingError as err:
        raise WeightsError(f"{err}; expected a Qwen-Image weights folder with "
                           f"{sorted(REQUIRED)} (or a Hub id, or 'tiny')") from None


def check_folder(folder: Path, named: str) -> None:
    """An error naming every missing component and what was expected, before any load."""
    if not folder.is_dir():
        raise WeightsError(f"model.weights {named!r}: no such folder; expected a Qwen-Image "
                           f"weights folder with {sorted(REQUIRED)}, a Hub id such as "
                           "Qwen/Qwen-Image[@revision], or 'tiny'")
    missing = [f"{name}/{marker}" for name, marker in REQUIRED.items()
               if not (folder / name / marker).is_file()]
    if missing:
        raise WeightsError(f"model.weights {named!r} lacks {missing}; a Qwen-Image weights "
                           f"folder holds {sorted(REQUIRED)} as save_pretrained writes them")


def load_components(weights: str, dtype: torch.dtype, text_encoder: bool = True) -> Components:
    """The components of ``weights`` through diffusers' and transformers' ``from_pretrained``;
    without ``text_encoder`` the text encoder and tokenizer wait for
    :meth:`Components.load_text_encoder`."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers.utils import logging as transformers_logging

    folder = local_folder(weights)
    transformers_logging.disable_progress_bar()   # one bar per worker and component otherwise
    components = Components(
        transformer=QwenImageTransformer2DModel.from_pretrained(folder / "transformer",
                                                                torch_dtype=dtype),
        vae=AutoencoderKLQwenImage.from_pretrained(folder / "vae", torch_dtype=dtype),
        folder=folder, dtype=dtype)
    if text_encoder:
        components.load_text_encoder()
    return components


def load_text_encoder(folder: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The Qwen2.5-VL text encoder (eval mode) and its tokenizer from a weights folder."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    encoder = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder / "text_encoder",
                                                                 dtype=dtype).eval()
    return encoder, AutoTokenizer.from_pretrained(folder / "tokenizer")


def scheduler_sigmas(folder: Path, num_steps: int, image_tokens: int) -> torch.Tensor:
    """The ``num_steps + 1`` sigmas ``QwenImagePipeline`` denoises through: linspace(1, 1/N, N)
    set on the folder's ``FlowMatchEulerDiscreteScheduler`` with the resolution's dynamic shift
    ``mu`` (and its terminal stretch, if configured), then the final 0."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(folder / "scheduler")
    cfg = scheduler.config
    mu = calculate_shift(image_tokens, cfg.get("base_image_seq_len", 256),
                         cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                         cfg.get("max_shift", 1.15))
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps), mu=mu)
    return scheduler.sigmas.detach().float().cpu()


def _tiny_folder() -> Path:
    """The tiny components, built once into the cache (atomically: a half-built folder never
    counts)."""
    # tiny builds (and trains a tokenizer for) the test-size weights: only when they are asked for
    from spotlight.models.qwen_image.tiny import build_tiny_components

    folder = cache_root() / f"qwen-image-tiny-v{TINY_VERSION}"
    if not (folder / "model_index.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        build_tiny_components(building)
        publish(building, folder, "model_index.json")
    return folder
