"""Credentials never reach the manifest, Zarr attributes, any stored object, or the logs."""
from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch

from storage import RunStore

from .conftest import TEST_KEY, TEST_SECRET


def test_credentials_stay_out_of_storage_and_logs(moto_s3, caplog):
    cfg = moto_s3.config()
    with caplog.at_level(logging.DEBUG):
        store = RunStore.open(cfg)
        store.record_run(config={"seed": 0, "storage": cfg.public_dict()}, code_version="test")
        with store.latent_sink("iter-0/rollout") as sink:
            for t in range(3):
                sink.commit("r0", t, np.full((4, 2), t, np.float32), num_steps=2,
                            weights_version=0)
        store.append_rewards(0, {"prompt": ["a", "b"], "seed": [1, 2], "stage": "rollout",
                                 "reward": [0.5, 0.7], "weights_version": 0})
        store.save_checkpoint(0, {"w": torch.ones(2)}, metadata={"note": "x"})
        store.mark_stage_done("iter-0/rollout", {"requests": 1})
        store.load_checkpoint(0)
        store.read_trajectory("iter-0/rollout", "r0")

    # Every object of the run, byte for byte (manifest, zarr.json attributes, chunks, ...).
    fs, root = store.location.fs, store.location.root
    objects = fs.find(root)
    assert any(o.endswith("manifest.json") for o in objects)
    assert any(o.endswith("latents/r0/zarr.json") for o in objects)
    assert any(o.endswith("rewards.zarr/zarr.json") for o in objects)
    for obj in objects:
        data = fs.cat_file(obj)
        assert TEST_SECRET.encode() not in data, obj
        assert TEST_KEY.encode() not in data, obj

    # Logs: no record at all carries the secret; ours never carry the key id either.
    # (botocore's own DEBUG request dumps include the key id in the signed Authorization
    # header -- part of the SigV4 protocol, not the secret.)
    assert caplog.records
    for record in caplog.records:
        text = record.getMessage()
        assert TEST_SECRET not in text, record.name
        if record.name.startswith("storage") or record.levelno >= logging.INFO:
            assert TEST_KEY not in text, record.name


def test_config_repr_and_public_dict_hide_credentials(moto_s3):
    cfg = moto_s3.config()
    for text in (repr(cfg), str(cfg.public_dict()), repr(RunStore.open(cfg))):
        assert TEST_SECRET not in text and TEST_KEY not in text
    assert not {"key", "secret", "token"} & set(cfg.public_dict())


def test_writing_a_credential_into_the_manifest_is_refused(moto_s3):
    store = RunStore.open(moto_s3.config())
    with pytest.raises(ValueError, match="refusing to write a credential"):
        store.record_run(config={"storage": {"secret": TEST_SECRET}})
    assert "config" not in store.manifest.read()["run"]


def test_error_messages_do_not_leak_credentials(moto_s3):
    cfg = moto_s3.config().with_url("s3://missing-bucket-for-secrets/run")
    from dataclasses import replace

    with pytest.raises(Exception) as info:
        RunStore.open(replace(cfg, create_bucket=False))
    assert TEST_SECRET not in str(info.value) and TEST_KEY not in str(info.value)


def test_run_store_pickles_for_workers(moto_s3):
    store = RunStore.open(moto_s3.config())
    store.mark_stage_done("iter-0/explore")
    clone = pickle.loads(pickle.dumps(store))  # in-memory transfer to a worker process
    assert clone.url == store.url and clone.is_stage_done("iter-0/explore")
