"""``spotlight run --dry-run``: the sizing table, computed from the config alone."""
from __future__ import annotations

import dataclasses
import re

import pytest

from spotlight import main
from spotlight.config import PROJECT_ROOT
from spotlight.sizing import (
    CALIBRATED_PARAMS,
    ModelSize,
    forward_s,
    inference_memory_gib,
    iteration_estimates,
)


def test_the_1280_config_is_sized_from_the_published_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--dry-run", "--config",
                 str(PROJECT_ROOT / "configs" / "qwen-image-1280.yaml")]) == 0
    out = capsys.readouterr().out
    assert "transformer 20.43 B params" in out and "6400 image tokens" in out
    for stage, workers in (("rollout", "8 x gpu"), ("explore", "16 x spot"), ("train", "8 x gpu")):
        assert re.search(rf"^{stage}\s+{workers}\s+[\d.]+ GiB\s+[\d.]+$", out, re.M), stage
    assert re.search(r"total \$\d+\.\d\d", out) and "how:" in out
    # The planner's arm that fits the training window is what the explore row shows.
    n, m = map(int, re.search(r"explores N=(\d+) candidates x M=(\d+) steps", out).groups())
    assert (n, m) in [(c, s) for c in (24, 32, 48) for s in (18, 16, 24)]
    assert "exploration fits in it" in out
    # 8 gpu and 16 spot workers on 8-GPU instances: a worker process per GPU.
    assert 'start gpu: 1 x p5.48xlarge (8 GPUs each), on each `dask worker ADDR --resources ' \
        '"gpu=1" --nworkers 8 --nthreads 1`' in out
    assert "start spot: 2 x p5.48xlarge (8 GPUs each)" in out
    assert list(tmp_path.iterdir()) == []   # no run store, no report: nothing written


def test_more_spot_workers_let_the_planner_explore_more(tmp_path, capsys):
    config = str(PROJECT_ROOT / "configs" / "qwen-image-512.yaml")
    arms = []
    for spot in (4, 16):
        assert main(["run", "--dry-run", "--config", config, "--set",
                     f"cluster.spot_workers={spot}"]) == 0
        out = capsys.readouterr().out
        found = re.search(r"explores N=(\d+) candidates x M=(\d+) steps", out)
        arms.append(int(found.group(1)) * int(found.group(2)) if found else 0)
    assert arms[1] > arms[0]


def test_the_tiny_config_is_sized_from_its_own_components(capsys):
    assert main(["run", "--dry-run", "--config",
                 str(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml")]) == 0
    out = capsys.readouterr().out
    assert "4 bytes per weight" in out and "32 image tokens" in out   # fp32 on CPU, 16x32


def test_estimates_grow_with_the_work():
    assert forward_s(4096, 1) > forward_s(1024, 1) > 0
    # A 20 B pass is compute-bound from batch 1: sixteen images cost sixteen times one.
    assert forward_s(1024, 16) == pytest.approx(16 * forward_s(1024, 1))
    assert forward_s(1024, 1) == pytest.approx(0.0588)
    assert forward_s(4096, 2) == pytest.approx(0.0588 * 4 ** 0.965 * 2)
    size = ModelSize(transformer=10**9, vae=10**8, text_encoder=10**9, trainable=10**6,
                     weight_bytes=2, hidden=3072, layers=60, latent_channels=64,
                     image_tokens=1024)
    assert inference_memory_gib(size, 4, 10, True) > inference_memory_gib(size, 4, 10, False)
    assert inference_memory_gib(size, 8, 10, True) > inference_memory_gib(size, 4, 10, True)


def test_dry_run_does_not_go_with_resume(capsys):
    assert main(["run", "--dry-run", "--resume", "file:///nowhere"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_a_policy_without_a_sizer_says_so(capsys):
    code = main(["run", "--dry-run", "--config", str(PROJECT_ROOT / "configs" / "digits.yaml")])
    assert code != 0 and "policy 'digits' cannot size itself" in capsys.readouterr().err


def test_checkpointing_shrinks_training_memory_and_oversized_stages_are_flagged(capsys):
    from spotlight.sizing import training_memory_gib

    size = ModelSize(transformer=20 * 10**9, vae=10**8, text_encoder=8 * 10**9,
                     trainable=4 * 10**8, weight_bytes=2, hidden=3072, layers=60,
                     latent_channels=64, image_tokens=6400)
    full, ckpt = training_memory_gib(size, 8), training_memory_gib(size, 8, checkpointing=True)
    assert ckpt < full / 5
    assert training_memory_gib(size, 8, True, passes=2) > ckpt   # true CFG keeps both passes
    config = str(PROJECT_ROOT / "configs" / "qwen-image-1280.yaml")
    assert main(["run", "--dry-run", "--config", config, "--set",
                 "model.gradient_checkpointing=false", "--set", "grpo.micro_batch=16"]) == 0
    assert re.search(r"^train .*GiB.*> an 80 GiB H100$", capsys.readouterr().out, re.M)
    assert main(["run", "--dry-run", "--config", config]) == 0
    assert "> an 80 GiB H100" not in capsys.readouterr().out   # the shipped config fits


def test_a_lora_step_costs_fewer_forwards_than_full_tuning_and_the_dry_run_says_how_many(capsys):
    common = dict(prompts=1, group=4, steps=1, cfg=False, request_prompts=1, candidates=1,
                  explore_steps=1, explore_batch=1, micro_batch=4, trained_steps=1,
                  gpu_workers=1, spot_workers=0, checkpointing=False, reference=False)
    lora = ModelSize(transformer=CALIBRATED_PARAMS, vae=0, text_encoder=0, trainable=10**6,
                     weight_bytes=2, hidden=3072, layers=60, latent_channels=64, image_tokens=1024)
    full = dataclasses.replace(lora, trainable=lora.transformer)
    lora_s, full_s = (iteration_estimates(s, **common)[2].seconds for s in (lora, full))
    # By hand: forward_s(1024, 4) = 4 x 58.8 ms (the measured transformer: work 1); LoRA 2.4
    # forwards, full tuning 3.
    assert lora_s == pytest.approx(2.4 * 4 * 0.0588)
    assert full_s == pytest.approx(3.0 * 4 * 0.0588)
    assert main(["run", "--dry-run", "--config",
                 str(PROJECT_ROOT / "configs" / "qwen-image-1280.yaml")]) == 0
    out = capsys.readouterr().out
    assert "4.4 forwards" in out and "measured by check-gpu on an H200" in out
