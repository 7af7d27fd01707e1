"""The whole pipeline on Qwen-Image's real components (tiny, random, built offline): stale
exploration on the spot worker, rollout/reward/LoRA training on the gpu worker, adapter-only
checkpoints, latents in Zarr, rewards in rewards.zarr, and the audit reading it back."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from pipelines.front.session import Session
from spotlight import main
from spotlight.config import PROJECT_ROOT, load_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_two_spotlight_iterations_on_tiny_qwen_image(tmp_path, capsys):
    config = load_config(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml")
    url = str(tmp_path / "run")
    with Session.from_config(config, store=url, mode="spotlight") as session:
        history = session.run(2)
        store = session.store
        tasks = [t for k in range(2) for t in store.get_json(f"iter-{k}/iteration", "tasks")["tasks"]]
        base, final = store.load_checkpoint(0).weights, store.load_checkpoint(2).weights
    assert list(history.index) == [0, 1]
    # The checkpoints are the adapter alone, in diffusers' LoRA layout.
    assert set(base) == set(final) and all(".lora_" in k for k in final)
    assert all(k.startswith("transformer.") for k in final)
    lora_b = [k for k in base if "lora_B" in k]
    assert lora_b and all(not base[k].any() for k in lora_b)   # a fresh adapter: the identity
    explores = [t for t in tasks if t["stage"] == "explore"]
    assert explores and {(t["iteration"], t["weights_version"]) for t in explores} == {(1, 0)}
    assert all(t["worker"].startswith("spot-") for t in explores)
    assert all(t["worker"].startswith("gpu-") for t in tasks if t["stage"] in ("rollout", "train"))
    batch = xr.open_zarr(url + "/iter-000001/rollout.zarr/latents/batch")
    assert batch["latent"].shape == (config.sampler.num_steps + 1, 8, 32, 64)
    rewards = xr.open_zarr(url + "/rewards.zarr")
    assert np.isfinite(rewards["reward"].values).sum() >= 16 + 32
    assert main(["audit", url]) == 0
    assert "explore" in capsys.readouterr().out
