"""Where a Qwen-Image policy's components come from: a local folder, an object-storage URL
(copied once to a local cache through fsspec and checksummed), a Hugging Face Hub id such as
``Qwen/Qwen-Image[@revision]`` (fetched once per machine into the Hub cache and checksummed: see
:mod:`spotlight.models.hub`), or ``tiny`` (tiny random components built offline into the cache,
then loaded exactly like real weights). How each is resolved is every diffusers policy's
(:mod:`spotlight.models.diffusers_parts`); what is Qwen-Image's is its :data:`LAYOUT`.

A folder has diffusers' layout: ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``
(and ``scheduler/``, ``model_index.json``), each as its library's ``save_pretrained`` wrote it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotlight.models import diffusers_parts
from spotlight.models.diffusers_parts import TINY, WeightsError, WeightsLayout, resolve_dtype

# TINY, WeightsError and resolve_dtype are every diffusers policy's, here where they always were
__all__ = ["TINY", "WeightsError", "resolve_dtype", "Components", "local_folder", "check_folder",
           "load_components", "load_text_encoder", "scheduler_sigmas"]

TINY_VERSION = 2                       # bump when the tiny components change


def _build_tiny(folder: Path) -> Path:
    # tiny builds (and trains a tokenizer for) the test-size weights: only when they are asked for
    from spotlight.models.qwen_image.tiny import build_tiny_components

    return build_tiny_components(folder)


LAYOUT = WeightsLayout(
    model="Qwen-Image",
    # Component folder -> the file that shows it is there (what save_pretrained writes first).
    required={"transformer": "config.json", "vae": "config.json", "text_encoder": "config.json",
              "tokenizer": "tokenizer_config.json", "scheduler": "scheduler_config.json"},
    hub_example="Qwen/Qwen-Image", tiny_cache=f"qwen-image-tiny-v{TINY_VERSION}",
    build_tiny=_build_tiny)


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


def local_folder(weights: str, configs_only: bool = False) -> Path:
    """A local folder holding the Qwen-Image components of ``weights`` (a path, a URL, a Hub id
    or ``tiny``); with ``configs_only`` a Hub id fetches only their JSON files."""
    return diffusers_parts.local_folder(LAYOUT, weights, configs_only)


def check_folder(folder: Path, named: str) -> None:
    """An error naming every missing component and what was expected, before any load."""
    diffusers_parts.check_folder(LAYOUT, folder, named)


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
    import json

    import numpy as np
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    cfg = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    mu = calculate_shift(image_tokens, cfg.get("base_image_seq_len", 256),
                         cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                         cfg.get("max_shift", 1.15))
    return diffusers_parts.scheduler_sigmas(
        folder, sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps), mu=mu)
