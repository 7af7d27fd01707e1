"""StorageConfig validation and run URL resolution."""
from __future__ import annotations

import os
import pickle

import pytest

from storage import RunStore, StorageConfig, StorageUnavailableError
from storage.retry import RetryPolicy, call_with_retry, is_transient
from storage.urls import open_location, s3_options


@pytest.mark.parametrize("fields,match", [
    ({"url": ""}, "non-empty"),
    ({"url": "gs://bucket/run"}, "scheme 'gs'"),
    ({"url": "s3://AKIA:secret@bucket/run"}, "must not carry credentials"),
    ({"url": "s3:///run"}, "names no bucket"),
    ({"endpoint_url": "127.0.0.1:9000"}, "http://"),
    ({"queue_size": 0}, "queue_size"),
    ({"retries": -1}, "retries"),
    ({"backoff_s": float("nan")}, "backoff_s"),
    ({"backoff_s": 2.0, "max_backoff_s": 1.0}, "max_backoff_s"),
    ({"key": "only-the-key"}, "together"),
    ({"queue_size": True}, "queue_size"),
    ({"commit_interval_s": -1.0}, "commit_interval_s"),
])
def test_bad_config_is_refused_with_a_clear_message(fields, match):
    with pytest.raises(ValueError, match=match):
        StorageConfig(**fields)


def test_default_is_a_local_run_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = open_location(StorageConfig())
    assert loc.scheme == "file" and loc.root == os.path.join(str(tmp_path), "runs", "default")
    assert loc.url == "file://" + loc.root
    assert open_location(StorageConfig(url="file://rel/run")).root == str(tmp_path / "rel" / "run")


def test_memory_and_s3_urls():
    assert open_location(StorageConfig(url="memory://a/b/")).url == "memory://a/b"
    loc = open_location(StorageConfig(url="s3a://bucket/pre/fix", endpoint_url="http://h:1"))
    assert (loc.scheme, loc.root, loc.url) == ("s3", "bucket/pre/fix", "s3://bucket/pre/fix")
    assert loc.child_url("rewards.zarr") == "s3://bucket/pre/fix/rewards.zarr"


def test_s3_options_prefer_config_over_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-env:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-0001")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    opts, endpoint = s3_options(StorageConfig(url="s3://b/r"))
    assert endpoint == "http://from-env:1" and opts["key"] == "ENVKEY0001"
    assert opts["client_kwargs"] == {"region_name": "eu-west-1"}
    assert opts["config_kwargs"]["request_checksum_calculation"] == "when_required"
    opts, endpoint = s3_options(StorageConfig(url="s3://b/r", endpoint_url="http://cfg:2",
                                              key="CFGKEY0001", secret="cfg-secret-0001"))
    assert endpoint == "http://cfg:2" and opts["secret"] == "cfg-secret-0001"


def test_local_run_url_that_is_a_file_fails_at_open(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(StorageUnavailableError, match="is a file"):
        RunStore.open(str(path))


def test_open_with_overrides_and_pickle():
    store = RunStore.open(StorageConfig(url="memory://spotlight-tests/override"), queue_size=3)
    assert store.config.queue_size == 3
    store.mark_stage_done("iter-0/rollout")
    assert pickle.loads(pickle.dumps(store)).is_stage_done("iter-0/rollout")


def test_retry_gives_up_with_a_clear_error_and_passes_permanent_errors():
    calls = []

    def flaky():
        calls.append(1)
        raise ConnectionResetError("peer went away")

    policy = RetryPolicy(retries=2, backoff_s=0.0, max_backoff_s=0.0)
    with pytest.raises(StorageUnavailableError, match="could not write s3://b/x at endpoint "
                       "http://e:1: gave up after 3 attempts.*ConnectionResetError"):
        call_with_retry(flaky, what="write", url="s3://b/x", policy=policy, endpoint="http://e:1")
    assert len(calls) == 3

    def missing():
        calls.append(1)
        raise FileNotFoundError("s3://b/y")

    calls.clear()
    with pytest.raises(FileNotFoundError):
        call_with_retry(missing, what="read", url="s3://b/y", policy=policy)
    assert len(calls) == 1
    assert is_transient(TimeoutError()) and not is_transient(PermissionError())
    assert not is_transient(ValueError("bad input"))
