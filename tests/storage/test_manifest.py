"""Manifest and stage records: a stage is complete iff its record is in the manifest."""
from __future__ import annotations

import json

import pytest

from storage import CorruptObjectError, NotCommittedError, RunStore, StorageConfig
from storage.manifest import stage_iteration, stage_key


def test_stage_records(store_config):
    store = RunStore.open(store_config)
    assert not store.is_stage_done("iter-12/rollout")
    record = store.mark_stage_done("iter-12/rollout", {"requests": 64, "preemptions": 2})
    assert record["info"] == {"requests": 64, "preemptions": 2}
    # Canonical names: iter-12 and iter-000012 are the same stage.
    assert store.is_stage_done("iter-000012/rollout")
    assert store.stage_record("iter-12/rollout")["info"]["requests"] == 64
    assert not store.is_stage_done("iter-12/explore")
    assert not store.is_stage_done("iter-13/rollout")
    # Another process opening the run sees the same records.
    other = RunStore.open(store_config, create=False)
    assert set(other.manifest.stages()) == {"iter-000012/rollout"}
    raw = json.loads(store.location.read_bytes("manifest.json"))
    assert "iter-000012/rollout" in raw["stages"]


def test_reopen_keeps_the_manifest(store_config):
    store = RunStore.open(store_config)
    store.mark_stage_done("iter-0/explore")
    store.record_run(config={"seed": 3}, code_version="abc123")
    again = RunStore.open(store_config)  # create=True on an existing run must not reset it
    assert again.is_stage_done("iter-0/explore")
    run = again.manifest.read()["run"]
    assert run["config"] == {"seed": 3} and run["code_version"] == "abc123"


def test_open_without_create_requires_a_run():
    with pytest.raises(NotCommittedError, match="no Spotlight run at memory://spotlight-tests/nope"):
        RunStore.open("memory://spotlight-tests/nope", create=False)


def test_unreadable_manifest_names_the_object(store_config):
    store = RunStore.open(store_config)
    store.location.write_bytes(b'{"format": "spotlight-run", "stages": {', "manifest.json")
    with pytest.raises(CorruptObjectError, match=r"manifest\.json.*not valid JSON"):
        store.is_stage_done("iter-1/rollout")
    store.location.write_bytes(b'{"format": "something-else"}', "manifest.json")
    with pytest.raises(CorruptObjectError, match="not a Spotlight run manifest"):
        store.manifest.read()


def test_stage_records_must_be_plain_json():
    store = RunStore.open("memory://spotlight-tests/json-only")
    with pytest.raises(ValueError, match="plain JSON"):
        store.mark_stage_done("iter-1/rollout", {"when": object()})
    assert not store.is_stage_done("iter-1/rollout")


@pytest.mark.parametrize("name,canonical,iteration", [
    ("iter-12/rollout", "iter-000012/rollout", 12),
    ("/iter-000003/explore/", "iter-000003/explore", 3),
    ("pretrain", "pretrain", None),
])
def test_stage_names(name, canonical, iteration):
    assert stage_key(name) == canonical
    assert stage_iteration(name) == iteration


@pytest.mark.parametrize("bad", ["", "iter-1/../x", "iter-1/roll out", "iter--1/rollout"])
def test_bad_stage_names_are_refused(bad):
    with pytest.raises(ValueError):
        stage_key(bad)


def test_config_is_recorded_without_credentials():
    cfg = StorageConfig(url="memory://spotlight-tests/no-secrets-here", key="AKIAEXAMPLEKEY",
                        secret="example-secret-value-1234")
    store = RunStore.open(cfg)
    store.record_run(config={"seed": 1})
    text = store.location.read_bytes("manifest.json").decode()
    assert "example-secret-value-1234" not in text and "AKIAEXAMPLEKEY" not in text
    assert json.loads(text)["run"]["storage"]["url"] == cfg.url


def test_the_writer_reads_once_and_readers_see_every_record(tmp_path):
    from storage import RunStore

    writer = RunStore.open(str(tmp_path / "run"), writer=True)
    reader = RunStore.open(str(tmp_path / "run"), create=False)
    start = writer.manifest.reads
    for k in range(5):   # an iteration's worth of checks and records
        assert writer.stage_record(f"iter-{k}/rollout") is None
        writer.mark_stage_done(f"iter-{k}/rollout", {"k": k})
        assert writer.stage_record(f"iter-{k}/rollout")["info"] == {"k": k}
    assert writer.manifest.reads - start <= 1
    assert [reader.stage_record(f"iter-{k}/rollout")["info"]["k"]
            for k in range(5)] == list(range(5))
    # A copy handed out cannot change the writer's own.
    writer.stage_record("iter-0/rollout")["info"]["k"] = 99
    assert writer.stage_record("iter-0/rollout")["info"]["k"] == 0


def test_a_worker_writes_checkpoint_files_and_only_the_writer_commits_them(tmp_path):
    import torch

    from storage import RunStore

    writer = RunStore.open(str(tmp_path / "run"), writer=True)
    worker = RunStore.open(str(tmp_path / "run"), create=False)   # as unpickled on a worker
    record = worker.write_checkpoint(1, {"w": torch.ones(3)})
    assert writer.latest_checkpoint() is None and worker.latest_checkpoint() is None
    writer.commit_checkpoint(record)
    assert worker.latest_checkpoint() == 1
    assert torch.equal(worker.load_checkpoint(1).weights["w"], torch.ones(3))
