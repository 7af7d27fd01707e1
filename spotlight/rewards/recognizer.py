"""A small CNN that reads one digit from a colour patch; the eye behind the OCR and GenEval rewards.

It is trained on scikit-learn's bundled 8x8 digits (nothing is downloaded), with a stratified 20%
held out. Training patches paste a digit at a random offset into a ``PATCH`` x ``PATCH`` square
in a random ink colour, with mild blur, noise and stray neighbour ink, because the detector crops
noisy generated canvases and the geneval world draws digits in any palette colour. Weights are
cached as safetensors under ``model_dir("recognizer-<hash>")`` keyed by the training recipe, so
later runs load in milliseconds instead of retraining; nothing is ever unpickled.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from spotlight.cache import model_dir, write_atomically
from spotlight.config import RewardConfig, config_hash
from spotlight.models.prompts import PALETTE
from spotlight.models.world import DIGIT, digit_images

log = logging.getLogger(__name__)

PATCH = 12
"""Side of the square patch the recogniser reads; an 8x8 digit fits with 2 pixels of slack."""
RECIPE = "digitnet-v1"
"""Bump whenever the architecture, augmentation or split changes, so stale caches are retrained."""
_BATCH = 64
_LR = 5e-3
_DEFAULTS = RewardConfig()
_INKS = np.asarray([*PALETTE.values(), (1.0, 1.0, 1.0)], np.float32)


class DigitNet(nn.Module):
    """Two conv blocks and a small head: ~99% on held-out 8x8 digits, trains in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 48, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 12 -> 6
            nn.Conv2d(48, 96, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 6 -> 3
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(96 * 9, 256), nn.ReLU(),
                                  nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@dataclass
class Recognizer:
    """A trained ``DigitNet`` with its held-out accuracy; read with ``classify`` or
    ``probabilities``."""

    model: DigitNet
    accuracy: float
    train_seconds: float
    path: Path
    from_cache: bool

    def classify(self, patches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels (int64) and softmax confidences (float64) of ``(N, 3, PATCH, PATCH)`` patches."""
        return classify(self.model, patches)

    def probabilities(self, patches: np.ndarray) -> np.ndarray:
        """Each patch's softmax over the ten digits, (N, 10) float64."""
        return probabilities(self.model, patches)


def classify(model: DigitNet, patches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels (int64) and softmax confidences (float64) of ``(N, 3, PATCH, PATCH)`` patches."""
    probs = probabilities(model, patches)
    return probs.argmax(axis=1).astype(np.int64), probs.max(axis=1)


@torch.no_grad()
def probabilities(model: DigitNet, patches: np.ndarray) -> np.ndarray:
    """Softmax over the ten digits (float64, (N, 10)) of ``(N, 3, PATCH, PATCH)`` patches."""
    patches = np.asarray(patches, np.float32)
    if patches.ndim != 4 or patches.shape[1:] != (3, PATCH, PATCH):
        raise ValueError(f"classify expects patches of shape (N, 3, {PATCH}, {PATCH}), "
                         f"got {patches.shape}; crop them with spotlight.rewards.detect")
    if len(patches) == 0:
        return np.zeros((0, 10), np.float64)
    model.eval()
    probs = torch.softmax(model(torch.from_numpy(np.clip(patches, 0.0, 1.0))), dim=1)
    return probs.numpy().astype(np.float64)


def random_inks(n: int, rng: np.random.Generator) -> np.ndarray:
    """Ink colours (n, 3): a palette colour, white, or random RGB with brightest channel >= 0.5."""
    pick = rng.integers(0, len(_INKS) + 1, size=n)
    rgb = rng.random((n, 3)).astype(np.float32)
    rgb *= (rng.uniform(0.5, 1.0, size=(n, 1)) / np.maximum(rgb.max(1, keepdims=True), 1e-3))
    return np.where((pick < len(_INKS))[:, None], _INKS[np.minimum(pick, len(_INKS) - 1)], rgb)


def make_patches(glyphs: np.ndarray, rng: np.random.Generator, *, centred: bool = False,
                 augment: bool = True) -> np.ndarray:
    """Paste 8x8 glyphs into ``(N, 3, PATCH, PATCH)`` patches in random inks.

    ``centred`` fixes the offset (the held-out test); ``augment`` adds the shift, brightness,
    blur, noise and neighbour ink that generated canvases show.
    """
    n, slack = len(glyphs), PATCH - DIGIT
    gray = np.zeros((n, PATCH, PATCH), np.float32)
    offsets = (np.full((n, 2), slack // 2) if centred else rng.integers(0, slack + 1, size=(n, 2)))
    for i, (y, x) in enumerate(offsets):
        gray[i, y:y + DIGIT, x:x + DIGIT] = glyphs[i]
    if augment:
        _add_neighbour_ink(gray, offsets, rng)
    patches = gray[:, None] * random_inks(n, rng)[:, :, None, None]
    if augment:
        patches *= rng.uniform(0.6, 1.0, size=(n, 1, 1, 1)).astype(np.float32)
        patches = _random_blur(patches, rng)
        patches += rng.normal(0.0, 1.0, patches.shape).astype(np.float32) * \
            rng.uniform(0.0, 0.08, size=(n, 1, 1, 1)).astype(np.float32)
    return np.clip(patches, 0.0, 1.0)


def _add_neighbour_ink(gray: np.ndarray, offsets: np.ndarray, rng: np.random.Generator) -> None:
    """For a quarter of patches, paste the edge of another digit 8-10 pixels to the left or right,
    as OCR strings with small gaps put it there (the detector masks most, not all, of it)."""
    images = digit_images()[0]
    for i in np.flatnonzero(rng.random(len(gray)) < 0.25):
        other = images[rng.integers(len(images))] * rng.uniform(0.3, 1.0)
        shift = int(rng.integers(DIGIT, DIGIT + 3)) * (1 if rng.random() < 0.5 else -1)
        y, x = int(offsets[i, 0]), int(offsets[i, 1]) + shift
        x0, x1 = max(x, 0), min(x + DIGIT, PATCH)
        if x0 < x1:
            region = gray[i, y:y + DIGIT, x0:x1]
            np.maximum(region, other[:, x0 - x:x1 - x], out=region)


def _random_blur(patches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Blend each patch with a Gaussian-blurred copy by a random amount (generated ink is soft)."""
    kernel1d = torch.tensor([0.25, 0.5, 0.25])
    kernel = (kernel1d[:, None] * kernel1d[None, :]).expand(3, 1, 3, 3).contiguous()
    blurred = nn.functional.conv2d(torch.from_numpy(patches), kernel, padding=1, groups=3).numpy()
    amount = (rng.random((len(patches), 1, 1, 1)) * (rng.random((len(patches), 1, 1, 1)) < 0.4))
    return patches * (1.0 - amount.astype(np.float32)) + blurred * amount.astype(np.float32)


def split_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stratified 80/20 split of the bundled digits: (train x, train y, held-out x, held-out y)."""
    images, labels = digit_images()
    # Imported here: scikit-learn costs every worker process two seconds at start-up otherwise.
    from sklearn.model_selection import train_test_split

    tr_x, te_x, tr_y, te_y = train_test_split(images, labels, test_size=0.2, stratify=labels,
                                              random_state=seed)
    return tr_x, tr_y, te_x, te_y


def held_out_accuracy(model: DigitNet, seed: int) -> float:
    """Accuracy on held-out digits pasted centred in the patch, in random inks (fixed draw)."""
    _, _, te_x, te_y = split_digits(seed)
    patches = make_patches(te_x, np.random.default_rng([seed, 1]), centred=True, augment=False)
    labels, _ = classify(model, patches)
    return float((labels == te_y).mean())


def train_recognizer(epochs: int, seed: int) -> tuple[DigitNet, float, float]:
    """Train a fresh ``DigitNet``; returns it with its held-out accuracy and training seconds.

    The caller's global torch RNG is left as it was (the seed is applied in a forked RNG), so
    training the recogniser mid-run cannot shift the run's own noise.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _train(epochs, seed)


def _train(epochs: int, seed: int) -> tuple[DigitNet, float, float]:
    start = time.perf_counter()
    rng = np.random.default_rng([seed, 0])
    tr_x, tr_y, _, _ = split_digits(seed)
    model = DigitNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=_LR, weight_decay=1e-4)
    steps_per_epoch = -(-len(tr_x) // _BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=_LR, epochs=epochs,
                                                   steps_per_epoch=steps_per_epoch)
    labels_all = torch.from_numpy(tr_y)
    model.train()
    for _ in range(epochs):
        # Fresh augmentation every epoch: the 1.4k digits are seen in new inks and places each time.
        patches = torch.from_numpy(make_patches(tr_x, rng))
        order = torch.from_numpy(rng.permutation(len(tr_x)))
        for batch in order.split(_BATCH):
            loss = nn.functional.cross_entropy(model(patches[batch]), labels_all[batch],
                                               label_smoothing=0.05)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    seconds = time.perf_counter() - start
    return model, held_out_accuracy(model, seed), seconds


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Use ``threads`` intra-op threads for the duration, then restore the caller's setting."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def recognizer_dir(epochs: int, seed: int) -> Path:
    """Cache folder of the recogniser of ``epochs`` and ``seed`` under the current ``RECIPE``."""
    key = config_hash({"recipe": RECIPE, "patch": PATCH, "epochs": epochs, "seed": seed})
    return model_dir(f"recognizer-{key}")


_LOADED: dict[Path, Recognizer] = {}


def load_or_train_recognizer(epochs: int = _DEFAULTS.recognizer_epochs,
                             seed: int = _DEFAULTS.recognizer_seed, *,
                             threads: int | None = None) -> Recognizer:
    """The cached recogniser for (``epochs``, ``seed``), training and caching it on first use.

    Loaded recognisers are also memoised in-process, so building several rewards costs one load.
    """
    path = recognizer_dir(epochs, seed)
    if path in _LOADED:
        return _LOADED[path]
    with _torch_threads(threads):
        recognizer = _load(path)
        if recognizer is None:
            model, accuracy, seconds = train_recognizer(epochs, seed)
            _save(path, model, {"recipe": RECIPE, "epochs": epochs, "seed": seed,
                                "accuracy": accuracy, "train_seconds": seconds})
            recognizer = Recognizer(model, accuracy, seconds, path, from_cache=False)
            log.info("trained digit recogniser in %.1f s: held-out accuracy %.4f (cached in %s)",
                     seconds, accuracy, path)
    _LOADED[path] = recognizer
    return recognizer


def _load(path: Path) -> Recognizer | None:
    """The recogniser cached in ``path``, or None when absent or unreadable (it is retrained)."""
    weights, meta_file = path / "weights.safetensors", path / "meta.json"
    if not (weights.is_file() and meta_file.is_file()):
        return None
    try:
        meta = json.loads(meta_file.read_text())
        model = DigitNet()
        model.load_state_dict(load_file(str(weights)))
        model.eval()
        return Recognizer(model, float(meta["accuracy"]), float(meta["train_seconds"]), path,
                          from_cache=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        log.warning("cached recogniser in %s is unreadable (%s); retraining it", path, err)
        return None


def _save(path: Path, model: DigitNet, meta: dict) -> None:
    """Write weights, then metadata, each by atomic rename: a concurrent reader never sees half a
    file, and the metadata (which ``_load`` requires) appears only after the weights are whole."""
    path.mkdir(parents=True, exist_ok=True)
    write_atomically(path / "weights.safetensors", lambda f: save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, f))
    write_atomically(path / "meta.json", lambda f: Path(f).write_text(json.dumps(meta, indent=2)))
