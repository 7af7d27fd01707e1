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
        tasks = [t for k in range(2)
                 for t in store.get_json(f"iter-{k}/iteration", "tasks")["tasks"]]
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
    # Prompt embeddings came from the run store: the spot worker never loaded the text encoder.
    assert not any(t["text_encoder"] for t in explores)
    assert all(store.prompts.has(p.text) for p in session.driver.prompts(1))
    # Spotlight's default placement: the rollout pulled by gpu and spot workers, training on gpu.
    assert all(t["worker"].startswith("gpu-") for t in tasks if t["stage"] == "train")
    assert {t["request"] for t in tasks if t["stage"] == "rollout"} == {"p0000"}
    batch = xr.open_zarr(url + "/iter-000001/rollout.zarr/latents/p0000")
    assert batch["latent"].shape == (config.sampler.num_steps + 1, 8, 32, 64)
    rewards = xr.open_zarr(url + "/rewards.zarr")
    assert np.isfinite(rewards["reward"].values).sum() >= 16 + 32
    assert main(["audit", url]) == 0
    assert "explore" in capsys.readouterr().out
    # The audit strip shows VAE-decoded images (8 samples of 16x32 stacked), not a heat map.
    png = tmp_path / "strip.png"
    assert main(["audit", url, "--iteration", "1", "--request", "p0000", "--png", str(png)]) == 0
    from PIL import Image

    steps = config.sampler.num_steps
    assert Image.open(png).size == ((steps + 1) * 32 + steps * 2, 8 * 16)


def test_a_spot_worker_killed_mid_exploration_resumes_from_its_last_committed_step(tmp_path):
    from pipelines.cluster.dispatch import RequestPool
    from pipelines.cluster.injector import SpotFleet
    from pipelines.run import tasks
    from storage import RunStore
    from tests.pipelines.test_preemption import REQUEST, explore_spec, wait_until

    config = load_config(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml",
                         {"sampler.num_steps": 400, "model.true_cfg": 1.0})
    seeds = np.arange(3)
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        store, handle = session.store, session.cluster
        clean = RequestPool(handle, [explore_spec(session, "clean", seeds)], config.preemption,
                            store=store)
        clean.wait(300)
        reference = clean.close()["r"]
        fleet = SpotFleet(handle, config.cluster)
        pool = RequestPool(handle, [explore_spec(session, "chaos", seeds)], config.preemption,
                           store=store)
        stage = tasks.stage_name(0, "chaos")
        for kill in range(1):   # the digits test kills twice
            wait_until(lambda: pool.dispatcher.requests["r"].attempt > kill
                       and pool.dispatcher.requests["r"].worker, 120, "a new attempt")
            before = (store.latents.commit_record(stage, REQUEST) or {"step": -1})["step"]
            wait_until(lambda: (store.latents.commit_record(stage, REQUEST) or {"step": -1})
                       ["step"] > before, 120, "a committed step")
            assert not pool.done, "the request finished before it was preempted"
            assert fleet.preempt(pool._addresses[pool.dispatcher.requests["r"].worker], "kill")
            fleet.add(1)
        pool.wait(300)
        out = pool.close()["r"]
    assert pool.summary()["preemptions_hard"] == 1
    np.testing.assert_array_equal(out.rewards, reference.rewards)
    run = RunStore.open(str(tmp_path / "run"), create=False)
    np.testing.assert_array_equal(np.asarray(run.read_trajectory(stage, REQUEST)),
                                  np.asarray(run.read_trajectory("iter-0/clean", REQUEST)))
    assert len(run.latents.commit_record(stage, REQUEST)["resumes"]) == 1


@pytest.mark.parametrize("change, message", [
    ({"model.lora_targets": ["to_q", "to_qq"]}, r"\['to_qq'\] match no module"),
    ({"model.dtype": "float16"}, "needs a GPU"),
    ({"world.canvas_height": 18}, "divisible by"),
    ({"model.weights": "MISSING_VAE"}, r"lacks \['vae/config.json'\]"),
])
def test_bad_model_input_fails_before_any_worker_starts_and_writes_nothing(
        tmp_path, monkeypatch, change, message):
    import shutil

    from pipelines.front import session as session_module
    from spotlight.models.qwen_image.weights import local_folder

    if change.get("model.weights") == "MISSING_VAE":
        broken = tmp_path / "weights"
        shutil.copytree(local_folder("tiny"), broken)
        shutil.rmtree(broken / "vae")
        change = {"model.weights": str(broken)}

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for a config that cannot run")

    monkeypatch.setattr(session_module, "_cluster_for", no_cluster)
    config = load_config(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml", change)
    with pytest.raises(ValueError, match=message):
        Session.from_config(config, store=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
