"""Validation image grids kept in the run store: what trackers log and reports show.

One entry per validated weights version, under the store's ``validation-grids`` stage:
``weights-<V>.npz`` (thumbnails as uint8 (N, H, W, 3) and their rewards) and
``weights-<V>.json`` (labels and the mean reward). Thumbnails are at most ``THUMBNAIL`` pixels
a side, so a 1280² model's grid stays small in object storage."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from storage.manifest import stage_key

STAGE = "validation-grids"
THUMBNAIL = 128     # pixels, longest side
MAX_IMAGES = 32     # per grid: enough to see a trend, small enough to store every validation


@dataclass(frozen=True)
class ValidationGrid:
    version: int              # weights version validated (0 = the base model)
    images: np.ndarray        # uint8 (N, H, W, 3)
    rewards: np.ndarray       # float32 (N,)
    labels: list[str]         # the prompt (or its target text) of each image
    mean_reward: float        # over the whole validation set, not only the images kept


def thumbnails(images: np.ndarray, size: int = THUMBNAIL) -> np.ndarray:
    """(N, 3, H, W) floats in [0, 1] -> uint8 (N, h, w, 3), longest side at most ``size``."""
    images = np.clip(np.asarray(images, dtype=np.float32), 0.0, 1.0)
    stride = max(1, -(-max(images.shape[-2:]) // size))   # ceil: never above ``size``
    small = images[:, :, ::stride, ::stride]
    return (small.transpose(0, 2, 3, 1) * 255).round().astype(np.uint8)


def validation_labels(prompts, rewards: np.ndarray) -> list[str]:
    """One label per validation image, prompt-major as validation draws them (``rewards`` is
    (prompts, seeds)): the prompt's target text (digits) or its text."""
    rewards = np.asarray(rewards)
    seeds = int(rewards.shape[1]) if rewards.ndim > 1 else 1
    return [(p.target or p.text) for p in prompts[: int(rewards.shape[0])] for _ in range(seeds)]


def grid_of(version: int, images: np.ndarray, rewards: np.ndarray, labels: list[str],
            mean_reward: float) -> ValidationGrid:
    """The stored grid of one validation: the first MAX_IMAGES images, one label each."""
    rewards = np.asarray(rewards, dtype=np.float32).reshape(-1)
    if len(labels) != len(rewards) or len(images) != len(rewards):
        raise ValueError(f"validation grid of weights {version}: {len(images)} images, "
                         f"{len(rewards)} rewards and {len(labels)} labels; expected one of each "
                         "per image")
    keep = slice(0, MAX_IMAGES)
    return ValidationGrid(version, thumbnails(images[keep]), rewards[keep], list(labels[keep]),
                          float(mean_reward))


def save_grid(store, grid: ValidationGrid) -> None:
    name = f"weights-{grid.version:05d}"
    store.put_arrays(STAGE, name, {"images": grid.images, "rewards": grid.rewards})
    store.put_json(STAGE, name, {"version": grid.version, "labels": grid.labels,
                                 "mean_reward": grid.mean_reward})


def load_grids(store) -> list[ValidationGrid]:
    """Every stored grid of the run, by weights version (none for runs made before grids)."""
    names = sorted(n[: -len(".json")] for n in store.location.list_names(stage_key(STAGE))
                   if n.startswith("weights-") and n.endswith(".json"))
    return [_read(store, name) for name in names]


def load_grid(store, version: int) -> ValidationGrid | None:
    """The stored grid of weights ``version``, or None if that version was not validated."""
    name = f"weights-{version:05d}"
    if not store.location.exists(stage_key(STAGE), f"{name}.json"):
        return None
    return _read(store, name)


def _read(store, name: str) -> ValidationGrid:
    meta, arrays = store.get_json(STAGE, name), store.get_arrays(STAGE, name)
    return ValidationGrid(int(meta["version"]), arrays["images"], arrays["rewards"],
                          list(meta["labels"]), float(meta["mean_reward"]))
