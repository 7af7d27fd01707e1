"""Pipeline fixtures: a tiny run config (seconds per iteration) as YAML and as a RunConfig; the
installed ``spotlight`` command run from outside the repository."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotlight.config import PROJECT_ROOT as ROOT
from spotlight.config import load_config

TINY_RUN = {
    "iterations": 2,
    "world": {"task": "ocr", "canvas_height": 12, "canvas_width": 32,
              "train_prompts": str(ROOT / "configs/prompts/ocr_train.txt"),
              "val_prompts": str(ROOT / "configs/prompts/ocr_val.txt")},
    "model": {"num_layers": 1, "num_attention_heads": 1, "attention_head_dim": 16, "text_dim": 16,
              "text_layers": 1},
    "pretrain": {"steps": 3, "batch_size": 8, "warmup_steps": 1},
    "grpo": {"prompts_per_iteration": 2, "group_size": 4, "micro_batch": 8},
    "sampler": {"num_steps": 3},
    "validation": {"max_prompts": 4, "every": 1},
    "exploration": {"candidates": 6, "request_batch": 3, "deadline": False},
    "planner": {"enabled": False},   # exploration settings fixed: runs compare bit for bit
    "cluster": {"dashboard": False, "worker_wait_s": 20},
    # The rollout as one gpu task (and exploration from the iteration's start): what these
    # tests exercise. Spotlight's default, the rollout pulled by gpu and spot workers, is
    # test_pulled_rollout's; both give the same results (one request here: 2 prompts < 4).
    "placement": {"rollout": ["gpu"]},
}


# What the fixtures run. Reading a string is all or nothing and a 3-step pretrained model writes
# none: with plain OCR every reward was 0, no weight moved, and equality checks compared zeros.
# (TINY_RUN itself keeps plain OCR: the digits pin's recorder builds its scenario on it, and
# the pin's cache key covers the recorder.)
TINY_WORLD = {**TINY_RUN, "reward": {"name": "ocr-dense"}}


def write_tiny_world(folder: Path) -> Path:
    """The tiny world's run config as a file in ``folder`` (what ``spotlight run`` reads)."""
    path = folder / "tiny-run.yaml"
    path.write_text(yaml.safe_dump(TINY_WORLD))
    return path


@pytest.fixture(scope="session")
def tiny_world_learns(tmp_path_factory) -> None:
    """The tiny world is not flat: one iteration of it (in process) gives every group rewards
    that differ and moves the weights. Checked once per session, before any test that relies
    on it -- a comparison of two runs of a flat world cannot fail."""
    import numpy as np
    import torch

    from pipelines.run.inprocess import InProcessRun
    from pipelines.run.tasks import stage_name

    path = write_tiny_world(tmp_path_factory.mktemp("tiny-world"))
    harness = InProcessRun(load_config(path), "vanilla", base_val_reward=0.0)
    try:
        harness.run_iterations(1)
        rewards = harness.store.get_arrays(stage_name(0, "reward"), "reward")["rewards"]
        before = harness.store.load_checkpoint(0).weights
        after = harness.store.load_checkpoint(1).weights
    finally:
        harness.close()
    assert (np.std(rewards, axis=1) > 0).all(), \
        f"the tiny world's rewards are flat in a group: {rewards}"
    moved = max(float((after[k].float() - before[k].float()).abs().max()) for k in after
                if torch.is_floating_point(after[k]))
    assert moved > 0, "training the tiny world moved no weight"


@pytest.fixture
def tiny_run_yaml(tmp_path, tiny_world_learns):
    return write_tiny_world(tmp_path)


@pytest.fixture
def tiny_run_config(tiny_run_yaml):
    return load_config(tiny_run_yaml)


# The console script the venv installed (what a user types), not this checkout's modules.
SPOTLIGHT = Path(sys.executable).with_name("spotlight")


@pytest.fixture
def outside_repo(tmp_path) -> Path:
    """A working folder outside the repository, as a user's."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    assert ROOT.resolve() not in folder.resolve().parents
    return folder


def spotlight_cli(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``spotlight ARGS`` through the installed command, run from ``cwd``. Under pytest the
    repository is on ``sys.path`` of this process and of any cluster it starts, which hid a
    bench whose workers could not import ``storage``; this process's environment (the test
    cache included) goes along, ``PYTHONPATH`` does not."""
    assert SPOTLIGHT.is_file(), f"{SPOTLIGHT} is missing: install the project (make install)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(SPOTLIGHT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_quick_bench(name: str, args: list[str], cwd: Path, out_json: Path,
                    timeout: float) -> tuple[dict, subprocess.CompletedProcess]:
    """``spotlight bench NAME --quick ARGS --json OUT_JSON`` from ``cwd``: it succeeds, and the
    JSON it writes is the object it prints last."""
    done = spotlight_cli(["bench", name, "--quick", *args, "--json", str(out_json)], cwd, timeout)
    assert done.returncode == 0, \
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(out_json.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
    return result, done
