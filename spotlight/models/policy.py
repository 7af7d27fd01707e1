"""The digits policy: diffusers' real QwenImageTransformer2DModel, tiny, in pixel space.

Canvases (3, H, W) in [-1, 1] are packed 2x2 into tokens of 12 channels, exactly as Qwen-Image
packs its VAE latents, so the transformer runs unchanged. The adapter exposes what the RL needs:
encode prompts, predict velocity on packed latents, decode, trainable parameters, save/load.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from diffusers import QwenImageTransformer2DModel
from safetensors.torch import load_file, save_file
from torch import nn

from spotlight.cache import write_atomically
from spotlight.config import ModelConfig
from spotlight.models.base import register_decoder, register_policy
from spotlight.models.text_encoder import PromptEncoder
from spotlight.models.world import to_pixels

CHANNELS = 3
PATCH = 2
SIGMA_MIN = 0.05  # below this, x0 -> velocity conversion would amplify errors


class MissingCheckpointError(FileNotFoundError):
    """A base or policy checkpoint is not where it was expected."""


def pack(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, C * 4), Qwen-Image's latent packing."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack`."""
    b = tokens.shape[0]
    x = tokens.view(b, height // PATCH, width // PATCH, CHANNELS, PATCH, PATCH)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, CHANNELS, height, width)


@register_policy("digits")
def digits_policy(config) -> "DigitsPolicy":
    """The digits world's policy for a run config (``model.policy: digits``)."""
    return DigitsPolicy(config.model, config.world.canvas_height, config.world.canvas_width)


@register_decoder("digits")
def digits_decoder(config):
    """For the audit: a stored canvas latent (tokens, 12) or batch (B, tokens, 12) -> its canvases
    stacked top to bottom, 1 px of white between (a ValueError for any other shape)."""

    height, width = config.world.canvas_height, config.world.canvas_width
    shape = ((height // PATCH) * (width // PATCH), CHANNELS * PATCH * PATCH)

    def decode(latent: np.ndarray) -> np.ndarray:
        a = np.asarray(latent)
        if a.ndim not in (2, 3) or a.shape[-2:] != shape:
            raise ValueError(f"latent of shape {a.shape} is not a {height}x{width} canvas")
        tokens = torch.from_numpy(np.ascontiguousarray(a.reshape(-1, *shape), dtype=np.float32))
        canvases = to_pixels(unpack(tokens, height, width).numpy()).transpose(0, 2, 3, 1)
        out = np.ones((len(canvases) * (height + 1) - 1, width, 3))
        for i, canvas in enumerate(canvases):
            out[i * (height + 1):i * (height + 1) + height] = canvas
        return out

    return decode


class DigitsPolicy(nn.Module):
    """Prompt encoder + QwenImageTransformer2DModel over packed pixel canvases; implements
    :class:`spotlight.models.base.Policy`."""

    def __init__(self, config: ModelConfig, height: int, width: int) -> None:
        super().__init__()
        self.config, self.height, self.width = config, height, width
        head = config.attention_head_dim
        self.text_encoder = PromptEncoder(config.text_dim, config.text_layers,
                                          config.max_prompt_tokens)
        self.transformer = QwenImageTransformer2DModel(
            patch_size=PATCH,
            in_channels=CHANNELS * PATCH * PATCH,
            out_channels=CHANNELS,
            num_layers=config.num_layers,
            attention_head_dim=head,
            num_attention_heads=config.num_attention_heads,
            joint_attention_dim=config.text_dim,
            axes_dims_rope=(8, (head - 8) // 2, (head - 8) // 2),
        )

    @property
    def tokens_shape(self) -> tuple[int, int]:
        """(tokens, channels) of one packed latent."""
        return (self.height // PATCH) * (self.width // PATCH), CHANNELS * PATCH * PATCH

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.text_encoder(prompts)

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor,
                 text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Predicted flow velocity (noise - data) for packed ``latents`` at noise level
        ``sigma``."""
        emb, mask = text
        shape = [(1, self.height // PATCH, self.width // PATCH)]
        out = self.transformer(
            hidden_states=latents,
            encoder_hidden_states=emb,
            encoder_hidden_states_mask=mask,
            timestep=sigma.expand(latents.shape[0]).to(latents.dtype),
            img_shapes=[shape] * latents.shape[0],
            return_dict=False,
        )[0]
        if self.config.prediction == "velocity":
            return out
        # Clean-canvas prediction: pixel data lies on a low-dimensional manifold that a small
        # network hits sooner than the noise-dominated velocity; convert with v = (x - x0) / sigma.
        sigma = sigma.reshape(-1, 1, 1).to(out.dtype).clamp_min(SIGMA_MIN)
        return (latents - out) / sigma

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Packed latents -> float32 pixels (B, 3, H, W) in [0, 1]."""
        x = unpack(latents.detach().float().cpu(), self.height, self.width).numpy()
        return to_pixels(x).astype(np.float32)

    def trainable_parameters(self, which: str = "transformer") -> list[nn.Parameter]:
        modules = ([self.transformer] if which == "transformer"
                   else [self.transformer, self.text_encoder])
        return [p for m in modules for p in m.parameters()]

    def reference(self) -> "DigitsPolicy":
        """A frozen copy of the weights as they are now (the KL reference)."""
        return copy.deepcopy(self).requires_grad_(False)

    # --- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path, extra: dict | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        meta = {"model": dataclasses.asdict(self.config), "height": self.height,
                "width": self.width, **(extra or {})}
        write_atomically(directory / "policy.json",
                         lambda f: Path(f).write_text(json.dumps(meta, indent=2)))
        # the weights file appears only when whole
        write_atomically(directory / "model.safetensors", lambda f: save_file(state, f))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "DigitsPolicy":
        directory = Path(directory)
        weights, meta_path = directory / "model.safetensors", directory / "policy.json"
        if not weights.is_file() or not meta_path.is_file():
            raise MissingCheckpointError(
                f"no policy checkpoint in '{directory}' (expected model.safetensors and "
                "policy.json); run `spotlight pretrain --config CONFIG` to create the base model")
        meta = json.loads(meta_path.read_text())
        policy = cls(ModelConfig(**meta["model"]), meta["height"], meta["width"])
        policy.load_state_dict(load_file(str(weights)))
        return policy
