"""Where an SD3.5 policy's components come from, and loading them.

``model.weights`` is resolved as for every diffusers policy
(:mod:`spotlight.models.diffusers_parts`): a local folder, an object-storage URL (copied once to
each machine's cache and checksummed), a Hub id such as
``stabilityai/stable-diffusion-3.5-medium[@revision]`` (fetched once per machine:
:mod:`spotlight.models.hub`), or ``tiny`` (:mod:`.tiny`, built offline into the cache). A folder
is ``StableDiffusion3Pipeline``'s: ``transformer/``, ``vae/``, ``text_encoder/`` and
``text_encoder_2/`` (CLIP-L and OpenCLIP bigG), ``text_encoder_3/`` (T5-XXL), their three
tokenizers and ``scheduler/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotlight.models import diffusers_parts
from spotlight.models.diffusers_parts import WeightsLayout

TINY_VERSION = 1  # bump when the tiny components change
CLIPS = ("text_encoder", "text_encoder_2")
T5 = "text_encoder_3"


def _build_tiny(folder: Path) -> Path:
    # tiny builds (and trains tokenizers for) the test-size weights: only when they are asked for
    from spotlight.models.sd35.tiny import build_tiny_components

    return build_tiny_components(folder)


LAYOUT = WeightsLayout(
    model="Stable Diffusion 3.5",
    required={
        "transformer": "config.json",
        "vae": "config.json",
        **{encoder: "config.json" for encoder in (*CLIPS, T5)},
        **{f"tokenizer{n}": "tokenizer_config.json" for n in ("", "_2", "_3")},
        "scheduler": "scheduler_config.json",
    },
    hub_example="stabilityai/stable-diffusion-3.5-medium",
    tiny_cache=f"sd35-tiny-v{TINY_VERSION}",
    build_tiny=_build_tiny,
)


@dataclass
class TextEncoders:
    """SD3.5's three text encoders and their tokenizers, in the pipeline's order."""

    clips: tuple[Any, Any]  # CLIPTextModelWithProjection: CLIP-L, OpenCLIP bigG
    clip_tokenizers: tuple[Any, Any]
    t5: Any  # T5EncoderModel
    t5_tokenizer: Any


@dataclass
class Components:
    """The loaded components; the text encoders are ``None`` until needed (a worker that reads
    prompt embeddings from the run store never loads them: T5-XXL alone is 4.8 B parameters)."""

    transformer: Any
    vae: Any
    folder: Path
    dtype: torch.dtype
    text: TextEncoders | None = None

    def load_text_encoders(self) -> TextEncoders:
        if self.text is None:
            self.text = load_text_encoders(self.folder, self.dtype)
        return self.text


def local_folder(weights: str, configs_only: bool = False) -> Path:
    """A local folder holding the SD3.5 components of ``weights`` (a path, a URL, a Hub id or
    ``tiny``); with ``configs_only`` a Hub id fetches only their JSON files."""
    return diffusers_parts.local_folder(LAYOUT, weights, configs_only)


def load_components(weights: str, dtype: torch.dtype, text_encoders: bool = True) -> Components:
    """The transformer and VAE of ``weights`` through diffusers' ``from_pretrained``; without
    ``text_encoders`` those wait for :meth:`Components.load_text_encoders`."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers.utils import logging as transformers_logging

    folder = local_folder(weights)
    transformers_logging.disable_progress_bar()  # one bar per worker and component otherwise
    components = Components(
        transformer=SD3Transformer2DModel.from_pretrained(
            folder / "transformer", torch_dtype=dtype
        ),
        vae=AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=dtype),
        folder=folder,
        dtype=dtype,
    )
    if text_encoders:
        components.load_text_encoders()
    return components


def load_text_encoders(folder: Path, dtype: torch.dtype) -> TextEncoders:
    """The two CLIP text encoders and T5 (eval mode) and their tokenizers, from a weights
    folder."""
    from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

    clips = tuple(
        CLIPTextModelWithProjection.from_pretrained(folder / name, dtype=dtype).eval()
        for name in CLIPS
    )
    return TextEncoders(
        clips=clips,  # type: ignore[arg-type]
        clip_tokenizers=(
            AutoTokenizer.from_pretrained(folder / "tokenizer"),
            AutoTokenizer.from_pretrained(folder / "tokenizer_2"),
        ),
        t5=T5EncoderModel.from_pretrained(folder / T5, dtype=dtype).eval(),
        t5_tokenizer=AutoTokenizer.from_pretrained(folder / "tokenizer_3"),
    )


def scheduler_sigmas(folder: Path, num_steps: int) -> torch.Tensor:
    """The ``num_steps + 1`` sigmas ``StableDiffusion3Pipeline`` denoises through: the folder's
    ``FlowMatchEulerDiscreteScheduler`` set to ``num_steps`` (SD3.5's fixed shift, 3), then the
    final 0."""
    return diffusers_parts.scheduler_sigmas(folder, num_inference_steps=num_steps)


def timestep_scale(folder: Path) -> float:
    """What a sigma is multiplied by to give the transformer's timestep: the scheduler's
    ``num_train_timesteps`` (the pipeline passes ``scheduler.timesteps = sigmas x it``)."""
    config = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    return float(config.get("num_train_timesteps", 1000))
