"""The digits results, pinned: a short run per mode gives exactly the rewards and final weights
recorded before the pipeline was hardened and reshaped (``tests/golden/digits.json``).

Refactors must not change what a run computes; this is where it would show. (Floating-point
results can differ on another CPU family or torch build: the file says where it was recorded.)
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import yaml

from pipelines.front.session import Session
from spotlight.config import PROJECT_ROOT, load_config
from tests.pipelines.conftest import TINY_RUN

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
GOLDEN = json.loads((PROJECT_ROOT / "tests" / "golden" / "digits.json").read_text())["modes"]


@pytest.fixture(scope="module")
def pinned_yaml(tmp_path_factory):
    run = dict(TINY_RUN, iterations=3)
    # A base model that renders something (rewards are not all zero), still seconds to train.
    run["pretrain"] = {"steps": 400, "batch_size": 16, "warmup_steps": 10}
    run["model"] = dict(TINY_RUN["model"], num_layers=2, attention_head_dim=32, text_dim=32)
    run["fidelity"] = {"audit_every": 5}   # the audit cadence of the recording (no audit in 3)
    path = tmp_path_factory.mktemp("pin") / "pinned.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def _weights_sha256(weights: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("mode", ["spotlight", "vanilla", "sync"])
def test_a_short_run_reproduces_the_recorded_digits_results(mode, pinned_yaml, tmp_path):
    config = load_config(pinned_yaml)
    with Session.from_config(config, store=str(tmp_path / mode), mode=mode) as session:
        history = session.run(3)
        store = session.store
        weights = store.load_checkpoint(3).weights
        rewards = store.open_rewards()["reward"].values
    expected = GOLDEN[mode]
    assert list(history["reward_mean"]) == expected["rollout_reward"]
    assert list(history["val_reward"]) == expected["val_reward"]
    assert hashlib.sha256(np.nan_to_num(rewards).tobytes()).hexdigest() == \
        expected["rewards_sha256"]
    assert _weights_sha256(weights) == expected["weights_sha256"]
