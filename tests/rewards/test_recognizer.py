"""The digit recogniser: held-out accuracy, any ink colour, and the safetensors cache."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from spotlight.models.prompts import PALETTE
from spotlight.rewards import recognizer as rec
from spotlight.rewards.recognizer import (
    PATCH,
    Recognizer,
    load_or_train_recognizer,
    make_patches,
    split_digits,
)


def test_held_out_accuracy_is_at_least_97_percent(recognizer: Recognizer) -> None:
    assert recognizer.accuracy >= 0.97
    # Recompute rather than trust the stored number.
    assert rec.held_out_accuracy(recognizer.model, seed=0) == pytest.approx(recognizer.accuracy)


@pytest.mark.parametrize("ink", [*PALETTE, "white"])
def test_reads_every_named_ink_colour(recognizer: Recognizer, ink: str) -> None:
    _, _, images, labels = split_digits(0)
    rgb = np.asarray(PALETTE.get(ink, (1.0, 1.0, 1.0)), np.float32)
    gray = make_patches(images, np.random.default_rng(0), centred=True, augment=False).max(axis=1)
    predicted, confidence = recognizer.classify(gray[:, None] * rgb[None, :, None, None])
    assert (predicted == labels).mean() >= 0.95
    assert predicted.dtype == np.int64 and confidence.dtype == np.float64
    assert np.all((confidence > 0) & (confidence <= 1))


def test_classify_checks_shape_and_accepts_empty(recognizer: Recognizer) -> None:
    labels, confidence = recognizer.classify(np.zeros((0, 3, PATCH, PATCH), np.float32))
    assert labels.shape == confidence.shape == (0,)
    with pytest.raises(ValueError, match=r"\(N, 3, 12, 12\)"):
        recognizer.classify(np.zeros((2, 1, 8, 8), np.float32))


def test_cache_round_trip_and_unreadable_cache(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path))
    rng_state = torch.random.get_rng_state()
    trained = load_or_train_recognizer(epochs=1, seed=3, threads=1)
    assert not trained.from_cache
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # the caller's RNG is untouched
    assert trained.path.parent == tmp_path and trained.path.name.startswith("recognizer-")
    meta = json.loads((trained.path / "meta.json").read_text())
    assert meta["accuracy"] == pytest.approx(trained.accuracy) and meta["epochs"] == 1
    assert load_or_train_recognizer(epochs=1, seed=3) is trained  # memoised in-process

    rec._LOADED.clear()
    loaded = load_or_train_recognizer(epochs=1, seed=3)
    assert loaded.from_cache and loaded.accuracy == pytest.approx(trained.accuracy)
    patches = make_patches(split_digits(3)[2][:64], np.random.default_rng(1))
    np.testing.assert_array_equal(loaded.classify(patches)[0], trained.classify(patches)[0])

    rec._LOADED.clear()
    (trained.path / "weights.safetensors").write_bytes(b"not a safetensors file")
    retrained = load_or_train_recognizer(epochs=1, seed=3, threads=1)
    assert not retrained.from_cache
    rec._LOADED.clear()
    assert load_or_train_recognizer(epochs=1, seed=3).from_cache


def test_cache_key_depends_on_epochs_and_seed() -> None:
    dirs = {rec.recognizer_dir(e, s) for e in (1, 2) for s in (0, 1)}
    assert len(dirs) == 4
    assert rec.recognizer_dir(1, 0) == rec.recognizer_dir(1, 0)
