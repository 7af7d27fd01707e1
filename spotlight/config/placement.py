"""Where a model's tensors live: ``model.device`` (with ``model.dtype``, what a worker builds).

The field sits in a base class of :class:`spotlight.config.model.ModelConfig`, so a config
still reads ``model.device`` beside ``model.dtype``. The name is only checked here; whether
the device exists is a worker's question (the driver of a run often has no GPU at all), asked
when the worker builds its policy (:func:`spotlight.models.device.resolve_device`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from spotlight.config.base import ConfigError, Validated, spec

DEVICE_NAME = re.compile(r"auto|cpu|meta|mps|(cuda|xpu)(:\d+)?")


@dataclass(kw_only=True, frozen=True)
class DevicePlacement(Validated):
    """The device of a model's weights and of every tensor its steps make."""

    device: str = spec("auto", "Device of the policy's weights and of every tensor of its "
                       "denoising and training steps (policies 'qwen-image', 'sd3.5'): 'auto' = "
                       "'cuda' where the worker has a GPU, else 'cpu'; or 'cuda', 'cuda:N', 'cpu' "
                       "('meta': shapes only, for tests). With model.dtype 'auto' a CUDA device "
                       "runs bfloat16.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not DEVICE_NAME.fullmatch(self.device):
            raise ConfigError(f"{type(self).__name__}.device = {self.device!r} is not a device; "
                              "expected 'auto', 'cpu', 'cuda' or 'cuda:N' (N the GPU's index)")
