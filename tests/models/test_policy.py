import json

import numpy as np
import pytest
import torch

from spotlight.models.policy import DigitsPolicy, MissingCheckpointError, pack, unpack
from spotlight.models.pretrain import base_model_dir, load_base_policy, pretrain
from spotlight.models.world import render_ocr, to_model_space


def test_pack_unpack_round_trip():
    x = torch.randn(2, 3, 12, 32)
    tokens = pack(x)
    assert tokens.shape == (2, 96, 12)
    assert torch.equal(unpack(tokens, 12, 32), x)


def test_policy_predicts_velocity_of_packed_shape(tiny_model_config):
    policy = DigitsPolicy(tiny_model_config, 12, 32)
    x = torch.randn(3, *policy.tokens_shape)
    v = policy.velocity(x, torch.tensor([0.5]),
                        policy.encode(["a", 'a sign that says "1"', "b c d"]))
    assert v.shape == x.shape and torch.isfinite(v).all()
    canvas = render_ocr("42", 12, 32, np.random.default_rng(0))
    decoded = policy.decode(pack(torch.from_numpy(to_model_space(canvas))[None]))
    assert np.allclose(decoded[0], canvas, atol=1e-6)


def test_save_load_round_trip(tmp_path, tiny_model_config):
    policy = DigitsPolicy(tiny_model_config, 12, 32)
    policy.save(tmp_path / "p")
    loaded = DigitsPolicy.load(tmp_path / "p")
    original, reloaded = policy.state_dict(), loaded.state_dict()
    assert len(original) > 10 and list(reloaded) == list(original)   # nothing lost or invented
    for name, a in original.items():
        assert torch.equal(a, reloaded[name]), name


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(MissingCheckpointError, match="spotlight pretrain"):
        DigitsPolicy.load(tmp_path / "nowhere")


def test_pretrain_smoke_caches_by_config_hash(tiny_config, tmp_path, monkeypatch):
    # A cache of its own: other tests of this process may have pretrained the same config.
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path))
    first = pretrain(tiny_config, progress=False)
    assert not first.cached and first.steps == 3
    meta = json.loads((first.directory / "pretrain.json").read_text())
    assert meta["steps"] == 3 and np.isfinite(meta["final_loss"])
    again = pretrain(tiny_config, progress=False)
    assert again.cached and again.directory == first.directory
    policy = load_base_policy(tiny_config)
    assert policy.height == 12 and policy.width == 32
    assert base_model_dir(tiny_config.with_values({"pretrain.seed": 1})) != first.directory


def test_workers_build_the_policy_the_config_names(tiny_config):
    from spotlight.models.base import POLICIES, Policy, build_policy, register_policy

    policy = build_policy(tiny_config)
    assert isinstance(policy, Policy) and isinstance(policy, DigitsPolicy)
    with pytest.raises(ValueError, match="model.policy = 'nope' is not a registered policy"):
        build_policy(tiny_config.with_values({"model.policy": "nope"}))

    @register_policy("test-echo")
    def echo(config):   # a second model, added without touching pipelines/ or storage/
        return DigitsPolicy(config.model, 12, 32)

    try:
        built = build_policy(tiny_config.with_values({"model.policy": "test-echo"}))
        assert isinstance(built, Policy) and built.tokens_shape == (96, 12)
    finally:
        POLICIES.pop("test-echo")
