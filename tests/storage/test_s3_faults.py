"""S3 faults against a real S3 API server (moto) on loopback, through s3fs."""
from __future__ import annotations

import errno
import logging
import os
import socket

import numpy as np
import pytest
import torch

from storage import RunStore, StorageConfig, StorageUnavailableError

from .conftest import BUCKET, TEST_KEY, TEST_SECRET

STAGE = "iter-2/rollout"
SHAPE = (8, 4)


def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_s3_fails_at_open_with_a_clear_error(caplog):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    cfg = StorageConfig(url=f"s3://{BUCKET}/runs/unreachable", endpoint_url=endpoint,
                        key=TEST_KEY, secret=TEST_SECRET, retries=2, backoff_s=0.01,
                        connect_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="storage"):
        with pytest.raises(StorageUnavailableError) as info:
            RunStore.open(cfg)
    message = str(info.value)
    assert "S3 unreachable" in message and "Nothing was done" in message
    assert f"s3://{BUCKET}/runs/unreachable" in message and endpoint in message
    assert "gave up after 3 attempts" in message
    assert sum("retry" in r.getMessage() for r in caplog.records) == 2
    assert TEST_SECRET not in message and TEST_KEY not in message


def test_missing_bucket_is_a_clear_error(moto_s3):
    cfg = moto_s3.config(create_bucket=False).with_url("s3://no-such-bucket-here/run")
    with pytest.raises(StorageUnavailableError, match="no-such-bucket-here.*does not exist"):
        RunStore.open(cfg)


def test_server_stopped_mid_stream_retries_then_fails_clearly(own_moto_s3, caplog):
    s3 = own_moto_s3
    store = RunStore.open(s3.config(retries=3, backoff_s=0.02))
    rng = np.random.default_rng(0)
    lats = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(6)]
    store.save_checkpoint(1, {"w": torch.arange(4.0)})
    store.mark_stage_done("iter-1/rollout", {"requests": 1})
    sink = store.latent_sink(STAGE)
    for t in range(3):
        sink.commit("r0", t, lats[t], num_steps=5, weights_version=2)
    sink.flush()
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r0"), np.stack(lats[:3]))

    s3.stop()  # the object store goes away mid-run
    with caplog.at_level(logging.WARNING, logger="storage"):
        sink.commit("r0", 3, lats[3], num_steps=5, weights_version=2)
        with pytest.raises(StorageUnavailableError) as info:
            sink.flush()
    message = str(info.value)
    assert "request 'r0' step 3" in message and "gave up after 4 attempts" in message
    assert s3.endpoint in message and "latents/r0/latent/c/3/0/0" in message
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert [m.split("retry ")[1][:3] for m in retries] == ["1/3", "2/3", "3/3"]
    with pytest.raises(StorageUnavailableError):  # the sink stays failed, loudly
        sink.commit("r0", 4, lats[4], num_steps=5, weights_version=2)
    sink.close(raise_errors=False)
    with pytest.raises(StorageUnavailableError, match="manifest.json"):
        store.mark_stage_done(STAGE)

    s3.restart()  # same port; what was committed before the outage is intact
    point = store.resume_point(STAGE, "r0")
    assert point.step == 2 and point.weights_version == 2
    np.testing.assert_array_equal(point.latent, lats[2])
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r0"), np.stack(lats[:3]))
    assert store.is_stage_done("iter-1/rollout") and not store.is_stage_done(STAGE)
    assert torch.equal(store.load_checkpoint(1).weights["w"], torch.arange(4.0))
    # ... and the request resumes where it stopped.
    with store.latent_sink(STAGE) as sink:
        for t in range(3, 6):
            sink.commit("r0", t, lats[t], num_steps=5, weights_version=2)
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r0"), np.stack(lats))


def test_permanent_errors_are_not_retried(moto_s3, caplog):
    store = RunStore.open(moto_s3.config())
    with caplog.at_level(logging.WARNING, logger="storage"):
        with pytest.raises(FileNotFoundError, match="nothing-here"):
            store.location.read_bytes("nothing-here.json")
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def test_env_credentials_and_endpoint(moto_s3, monkeypatch):
    """A config without endpoint/key/secret takes them from the standard AWS variables."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET)
    store = RunStore.open(StorageConfig(url=f"s3://{BUCKET}/runs/from-env", create_bucket=True))
    store.mark_stage_done("iter-0/explore")
    assert store.location.endpoint_url == moto_s3.endpoint
    assert RunStore.open(moto_s3.config("runs/from-env"), create=False).is_stage_done(
        "iter-0/explore")


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EDQUOT])
def test_a_read_only_or_full_store_fails_at_once_with_what_to_do(code):
    from storage.errors import StoragePermanentError
    from storage.retry import RetryPolicy, call_with_retry

    calls = []

    def write():
        calls.append(1)
        raise OSError(code, os.strerror(code), "/runs/r1/manifest.json")

    with pytest.raises(StoragePermanentError, match=r"could not write manifest of file:///runs/r1"
                                                    r".*Not retried: .*intact"):
        call_with_retry(write, what="write manifest of", url="file:///runs/r1",
                        policy=RetryPolicy(retries=4, backoff_s=0.01))
    assert len(calls) == 1


def test_permission_denied_is_raised_at_once():
    from storage.retry import RetryPolicy, call_with_retry

    calls = []

    def write():
        calls.append(1)
        raise PermissionError(errno.EACCES, "Permission denied", "/runs/r1/manifest.json")

    with pytest.raises(PermissionError):
        call_with_retry(write, what="write manifest of", url="file:///runs/r1",
                        policy=RetryPolicy(retries=4, backoff_s=0.01))
    assert len(calls) == 1


def test_a_store_away_for_less_than_the_patience_costs_a_pause_not_the_run(own_moto_s3):
    """The S3 server is down for about 3 s while a request streams (its host cut off, say).
    With patience 30 s the sink waits it out past its 2 counted retries: every step lands,
    nothing is lost, and the writes made during the outage are readable afterwards."""
    import threading
    import time

    s3 = own_moto_s3
    store = RunStore.open(s3.config(retries=2, backoff_s=0.05, max_backoff_s=0.5,
                                    connect_timeout_s=1.0, patience_s=30.0))
    rng = np.random.default_rng(1)
    lats = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(8)]
    with store.latent_sink(STAGE) as sink:
        for t in range(3):
            sink.commit("r0", t, lats[t], num_steps=7, weights_version=2)
        sink.flush()
        s3.stop()
        back = threading.Timer(3.0, s3.restart)
        back.start()
        down_at = time.monotonic()
        for t in range(3, 8):
            sink.commit("r0", t, lats[t], num_steps=7, weights_version=2)
        sink.flush()
        waited = time.monotonic() - down_at
        back.join()
    assert waited >= 2.5   # it did wait for the store (the server was down that long)
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r0"), np.stack(lats))
    assert store.latents.commit_record(STAGE, "r0")["step"] == 7


def test_patience_retries_past_the_count_and_names_itself_when_it_runs_out():
    import time

    from storage.retry import RetryPolicy, call_with_retry

    calls, start = [], time.monotonic()

    def flaky():
        calls.append(time.monotonic() - start)
        if calls[-1] < 0.3:
            raise ConnectionResetError("the store's host is away")
        return "ok"

    policy = RetryPolicy(retries=1, backoff_s=0.02, max_backoff_s=0.05, patience_s=5.0)
    assert call_with_retry(flaky, what="read", url="s3://b/run/x", policy=policy) == "ok"
    assert len(calls) > 2   # more tries than the one counted retry

    def down():
        raise ConnectionResetError("the store's host is away")

    with pytest.raises(StorageUnavailableError, match=r"gave up after \d+ attempts in "
                                                      r"0\.\ds \(patience 0\.2s\)"):
        call_with_retry(down, what="read", url="s3://b/run/x",
                        policy=RetryPolicy(retries=1, backoff_s=0.02, max_backoff_s=0.05,
                                           patience_s=0.2))
