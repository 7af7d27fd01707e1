"""Pipeline fixtures: a tiny run config (seconds per iteration) as YAML and as a RunConfig."""
from __future__ import annotations

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


@pytest.fixture
def tiny_run_yaml(tmp_path):
    path = tmp_path / "tiny-run.yaml"
    path.write_text(yaml.safe_dump(TINY_RUN))
    return path


@pytest.fixture
def tiny_run_config(tiny_run_yaml):
    return load_config(tiny_run_yaml)
