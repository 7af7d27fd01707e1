"""The whole pipeline on Stable Diffusion 3.5's real components (tiny, random, built offline):
exploration on the spot worker, rollout/reward/LoRA training on the gpu worker, an adapter-only
checkpoint a stock ``StableDiffusion3Pipeline`` loads, and the audit decoding latents through
the VAE; and the dry run sizing the published SD3.5-Medium recipes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import xarray as xr

from pipelines.front.session import Session
from spotlight import main
from spotlight.config import PROJECT_ROOT, load_config
from storage import RunStore
from tests.models.diffusers_checks import save_adapter
from tests.models.test_sd35 import stock_output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_spotlight_iterations_on_tiny_sd35(tmp_path, capsys):
    config = load_config(PROJECT_ROOT / "configs" / "sd35-tiny.yaml")
    url = str(tmp_path / "run")
    with Session.from_config(config, store=url, mode="spotlight") as session:
        history = session.run(2)
    store = RunStore.open(url, create=False)
    base, final = store.load_checkpoint(0).weights, store.load_checkpoint(2).weights
    assert list(history.index) == [0, 1]
    # Rewards vary within a group, so GRPO has advantages and the adapter moves.
    rewards = xr.open_zarr(url + "/rewards.zarr").to_dataframe().reset_index()
    rollout = rewards[(rewards["stage"] == "rollout") & np.isfinite(rewards["reward"])]
    groups = rollout.groupby(["iteration", "prompt"])["reward"]
    assert len(rollout) == 2 * 2 * 4 and groups.size().eq(4).all() and groups.std().min() > 0
    lora_b = [k for k in base if "lora_B" in k]
    assert lora_b and all(not base[k].any() for k in lora_b)  # a fresh adapter: the identity
    assert any(final[k].abs().max() > 0 for k in lora_b)
    assert set(base) == set(final) and all(
        k.startswith("transformer.") and ".lora_" in k for k in final
    )
    tasks = [store.get_json(f"iter-{k}/iteration", "tasks")["tasks"] for k in range(2)]
    explores = [t for t in sum(tasks, []) if t["stage"] == "explore"]
    assert explores and all(t["worker"].startswith("spot-") for t in explores)
    assert not any(t["text_encoder"] for t in explores)  # embeddings from the run store
    batch = xr.open_zarr(url + "/iter-000001/rollout.zarr/latents/p0000")
    assert batch["latent"].shape == (config.sampler.num_steps + 1, 8, 8 * 16, 16)  # (h w, 16)
    png = tmp_path / "strip.png"
    assert main(["audit", url, "--iteration", "1", "--request", "p0000", "--png", str(png)]) == 0
    from PIL import Image

    steps = config.sampler.num_steps
    assert Image.open(png).size == ((steps + 1) * 32 + steps * 2, 8 * 16)  # VAE-decoded
    _loads_into_a_stock_pipeline(final, tmp_path)


def _loads_into_a_stock_pipeline(adapter: dict, tmp_path) -> None:
    """The run's last checkpoint, copied out as a file, is a LoRA the stock pipeline loads."""
    import torch
    from diffusers import StableDiffusion3Pipeline

    from spotlight.models.sd35.weights import local_folder

    pipe = StableDiffusion3Pipeline.from_pretrained(local_folder("tiny"))
    pipe.set_progress_bar_config(disable=True)
    before = stock_output(pipe, "latent", 16, 32)
    pipe.load_lora_weights(str(tmp_path), weight_name=save_adapter(adapter, tmp_path))
    assert len(pipe.get_list_adapters()["transformer"]) == 1
    assert not torch.equal(stock_output(pipe, "latent", 16, 32), before)


@pytest.mark.parametrize("recipe", ["sd35-medium-ocr.yaml", "sd35-medium-geneval.yaml"])
def test_the_medium_recipes_are_sized_from_the_published_model(
    tmp_path, monkeypatch, capsys, recipe
):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--dry-run", "--config", str(PROJECT_ROOT / "configs" / recipe)]) == 0
    out = capsys.readouterr().out
    assert "model: sd3.5  transformer 2.24 B params" in out and "1024 image tokens" in out
    assert "trainable 18.8 M; 2 bytes per weight" in out
    for stage, workers in (("rollout", "4 x gpu"), ("explore", "4 x spot"), ("train", "4 x gpu")):
        assert re.search(rf"^{stage}\s+{workers}\s+[\d.]+ GiB\s+[\d.]+$", out, re.M), stage
    assert "> an 80 GiB H100" not in out
    # Its time is Qwen-Image's measurement scaled by the FLOPs of a pass (committed before any
    # SD3.5 measurement): 77 + 256 prompt tokens, 24 blocks of width 1536.
    assert "x 0.119 (this transformer's FLOPs per pass / the measured Qwen-Image's)" in out
    assert "1152 samples x 10 steps x 2 passes in batches of 24" in out
    assert "1152 samples x 9 trained steps" in out
    assert list(tmp_path.iterdir()) == []  # no run store, no report, nothing fetched
