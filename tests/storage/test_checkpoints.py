"""Checkpoints: safetensors round trip, sha256 verification, commit-by-manifest, no pickle."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from storage import CorruptObjectError, NotCommittedError, RunStore
from storage.checkpoints import OPTIMIZER, WEIGHTS, flatten_state, unflatten_state
from storage.urls import RunLocation


def make_model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for _ in range(2):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip_weights_and_optimizer(store_config):
    store = RunStore.open(store_config)
    model, opt = make_model_and_optimizer(0)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    weights["bf16"] = torch.randn(3, 3).to(torch.bfloat16)
    record = store.save_checkpoint(7, weights, opt.state_dict(), weights_version=8,
                                   metadata={"note": "after iteration 7"})
    assert set(record["files"]) == {WEIGHTS, OPTIMIZER}
    assert all(len(f["sha256"]) == 64 for f in record["files"].values())
    ck = store.load_checkpoint()
    assert (ck.iteration, ck.weights_version, ck.metadata) == (7, 8, {"note": "after iteration 7"})
    assert set(ck.weights) == set(weights)
    for k in weights:
        assert ck.weights[k].dtype == weights[k].dtype
        assert torch.equal(ck.weights[k], weights[k])
    # The loaded optimizer state drives a fresh optimizer exactly like the original.
    model2, _ = make_model_and_optimizer(1)
    model2.load_state_dict({k: v for k, v in ck.weights.items() if k != "bf16"})
    opt2 = torch.optim.AdamW(model2.parameters(), lr=5.0)
    opt2.load_state_dict(ck.optimizer_state)
    assert opt2.param_groups[0]["lr"] == 1e-3
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        m(x).square().sum().backward()
        o.step()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_flatten_state_round_trip_keeps_int_keys_and_tuples():
    state = {"state": {0: {"step": torch.tensor(3.0), "buf": torch.ones(2)}},
             "param_groups": [{"params": [0], "betas": (0.9, 0.99), "lr": 0.1, "name": None}]}
    tensors, skeleton = flatten_state(state)
    assert set(tensors) == {"state.0.step", "state.0.buf"}
    back = unflatten_state(json.loads(json.dumps(skeleton)), tensors)
    assert list(back["state"]) == [0] and back["param_groups"][0]["betas"] == (0.9, 0.99)
    with pytest.raises(TypeError, match="param_groups.0.bad"):
        flatten_state({"param_groups": [{"bad": object()}]})


def test_corrupted_checkpoint_names_the_object(store_config):
    store = RunStore.open(store_config)
    store.save_checkpoint(1, {"w": torch.arange(16, dtype=torch.float32)})
    parts = ("checkpoints", "iter-000001", WEIGHTS)
    data = bytearray(store.location.read_bytes(*parts))
    data[-3] ^= 0x01  # one bit of one tensor value
    store.location.write_bytes(bytes(data), *parts)
    with pytest.raises(CorruptObjectError, match=r"checkpoints/iter-000001/weights\.safetensors"
                       r".*sha256") as info:
        store.load_checkpoint(1)
    assert info.value.url == store.location.child_url(*parts)
    store.location.remove(*parts)
    with pytest.raises(CorruptObjectError, match="missing"):
        store.load_checkpoint(1)


def test_interrupted_write_never_becomes_latest(store_config, monkeypatch):
    store = RunStore.open(store_config)
    store.save_checkpoint(1, {"w": torch.zeros(3)})
    model, opt = make_model_and_optimizer(0)
    real_write = RunLocation.write_bytes

    def dies_on_optimizer(self, data, *parts, **kwargs):
        if parts[-1] == OPTIMIZER:
            raise KeyboardInterrupt("preempted while writing the optimizer state")
        return real_write(self, data, *parts, **kwargs)

    monkeypatch.setattr(RunLocation, "write_bytes", dies_on_optimizer)
    with pytest.raises(KeyboardInterrupt):
        store.save_checkpoint(2, model.state_dict(), opt.state_dict())
    monkeypatch.setattr(RunLocation, "write_bytes", real_write)
    assert store.location.exists("checkpoints", "iter-000002", WEIGHTS)  # data, but no record
    assert store.latest_checkpoint() == 1
    assert store.load_checkpoint().iteration == 1
    with pytest.raises(NotCommittedError, match="iteration 2"):
        store.load_checkpoint(2)
    # Re-saving an already committed iteration withdraws its record until the new one lands.
    monkeypatch.setattr(RunLocation, "write_bytes", dies_on_optimizer)
    with pytest.raises(KeyboardInterrupt):
        store.save_checkpoint(1, model.state_dict(), opt.state_dict())
    monkeypatch.setattr(RunLocation, "write_bytes", real_write)
    assert store.latest_checkpoint() is None
    store.save_checkpoint(2, model.state_dict(), opt.state_dict())
    assert store.checkpoints.iterations() == [2]


def test_loading_never_unpickles(store_config, monkeypatch):
    store = RunStore.open(store_config)
    model, opt = make_model_and_optimizer(0)
    store.save_checkpoint(4, model.state_dict(), opt.state_dict())

    def refuse(*args, **kwargs):
        raise AssertionError("pickle must never be loaded from storage")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    ck = store.load_checkpoint(4)
    assert set(ck.weights) == set(model.state_dict())
    raw = store.location.read_bytes("checkpoints", "iter-000004", OPTIMIZER)
    header_len = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8:8 + header_len])  # a safetensors (JSON) header, not a pickle


def test_tied_weights_are_saved():
    store = RunStore.open("memory://spotlight-tests/tied")
    shared = torch.randn(4, 4)
    store.save_checkpoint(0, {"embed": shared, "lm_head": shared, "view": shared[1]})
    ck = store.load_checkpoint(0)
    assert torch.equal(ck.weights["lm_head"], shared) and torch.equal(ck.weights["view"], shared[1])


def test_no_checkpoint_is_a_clear_error():
    store = RunStore.open("memory://spotlight-tests/no-ckpt")
    assert store.latest_checkpoint() is None
    with pytest.raises(NotCommittedError, match="no committed checkpoint"):
        store.load_checkpoint()
