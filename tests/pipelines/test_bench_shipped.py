"""The models a convergence bench keeps with its parts: checked by hash, and read first.

The whole round trip (a quick bench ships them, a resume with an empty cache uses them) is in
tests/pipelines/test_cli.py; these check the record and the refusals without training."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest

from pipelines.bench.shipped import (
    RECORD,
    ShippedModels,
    file_hashes,
    models_from,
    read_shipped,
    ship_models,
)
from spotlight.cache import MODELS_ENV, cache_dir, model_dir


def _kept(folder) -> ShippedModels:
    (folder / "base-ocr-abc").mkdir(parents=True)
    (folder / "base-ocr-abc" / "weights.safetensors").write_bytes(b"\x00weights")
    (folder / "recognizer-def").mkdir()
    (folder / "recognizer-def" / "meta.json").write_text("{}")
    shipped = ShippedModels(base_val_reward=0.25, base_val_standard_error=0.01,
                            files=file_hashes(folder), made_on="a CPU")
    (folder / RECORD).write_text(json.dumps(asdict(shipped)))
    return shipped


def test_kept_models_are_read_back_and_used_without_building_anything(tmp_path):
    folder = tmp_path / "models"
    assert read_shipped(folder) is None   # nothing kept yet
    shipped = _kept(folder)
    assert set(shipped.files) == {"base-ocr-abc/weights.safetensors", "recognizer-def/meta.json"}
    assert read_shipped(folder) == shipped

    def never():
        raise AssertionError("a kept base is not validated again")

    # config=None: with a record there, nothing is built, so the config is never read
    assert ship_models(folder, None, never) == shipped


@pytest.mark.parametrize("change", ["edit", "remove"])
def test_a_changed_or_missing_model_file_is_refused_by_name(tmp_path, change):
    folder = tmp_path / "models"
    _kept(folder)
    weights = folder / "base-ocr-abc" / "weights.safetensors"
    if change == "edit":
        weights.write_bytes(b"\x01weights")
    else:
        weights.unlink()
    with pytest.raises(ValueError, match="weights.safetensors (has sha256|is missing)") as err:
        read_shipped(folder)
    assert "Restore the folder" in str(err.value)


def test_models_are_read_from_the_shipped_folder_only_inside_models_from(tmp_path, monkeypatch):
    monkeypatch.delenv(MODELS_ENV, raising=False)
    assert model_dir("base-x") == cache_dir() / "base-x"
    with models_from(tmp_path / "kept"):
        assert model_dir("base-x") == tmp_path / "kept" / "base-x"
        with models_from(tmp_path / "inner"):
            assert model_dir("base-x") == tmp_path / "inner" / "base-x"
        assert model_dir("base-x") == tmp_path / "kept" / "base-x"
    assert MODELS_ENV not in os.environ
