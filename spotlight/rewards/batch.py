"""The one shape check every reward applies to a batch, in process or through a service."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spotlight.models.prompts import Prompt


def check_canvases(images: np.ndarray, prompts: Sequence[Prompt], reward: str) -> None:
    """Refuse a batch that is not (B, 3, H, W) canvases with one prompt each."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"reward '{reward}' expects canvases of shape (B, 3, H, W), "
                         f"got {images.shape}")
    if len(prompts) != len(images):
        raise ValueError(f"reward '{reward}' got {len(images)} canvases but {len(prompts)} "
                         "prompts; pass one prompt per canvas")
