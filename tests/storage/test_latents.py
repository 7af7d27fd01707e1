"""Latent streams: round trip, ordering, resume points, integrity, back-pressure."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from storage import (
    CorruptObjectError,
    NotCommittedError,
    ResumePoint,
    RunStore,
    SinkClosedError,
    StorageError,
    StreamOvertakenError,
)
from storage.attempts import FIRST, Attempt

STAGE = "iter-3/rollout"
SHAPE = (12, 4)  # (tokens, channels)


def toy_step(latent: np.ndarray, seed: int, t: int) -> np.ndarray:
    """A deterministic 'SDE step': its noise depends only on (seed, t), as in the contract."""
    noise = np.random.default_rng([seed, t]).standard_normal(latent.shape).astype(np.float32)
    return (0.9 * latent + 0.1 * np.tanh(latent) + 0.05 * noise).astype(np.float32)


def initial_noise(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 10**6]).standard_normal(SHAPE).astype(np.float32)


def run_request(sink, request: str, seed: int, num_steps: int, *, start=None, stop=None,
                attempt=FIRST):
    """Sample a request from scratch or from a resume point, committing every step."""
    if start is None:
        step, latent = 0, initial_noise(seed)
        sink.commit(request, 0, latent, num_steps=num_steps, weights_version=3, attempt=attempt)
    else:
        step, latent = start.step, start.latent
    for t in range(step, num_steps if stop is None else stop):
        latent = toy_step(latent, seed, t)
        sink.commit(request, t + 1, latent, num_steps=num_steps, weights_version=3,
                    attempt=attempt)
    return latent


def test_round_trip_many_requests_in_order(store_config):
    store = RunStore.open(store_config)
    rng = np.random.default_rng(0)
    expected = {f"p{i}-s{j}": [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(5)]
                for i in range(3) for j in range(2)}
    with store.latent_sink(STAGE, queue_size=4) as sink:
        for t in range(5):  # interleave requests step by step, as a batch of requests would
            for request, lats in expected.items():
                sink.commit(request, t, lats[t], num_steps=4, weights_version=3)
    assert store.requests(STAGE) == sorted(expected)
    for request, lats in expected.items():
        traj = store.read_trajectory(STAGE, request)
        assert traj.dtype == np.float32 and traj.shape == (5, *SHAPE)
        np.testing.assert_array_equal(traj, np.stack(lats))
        record = store.latents.commit_record(STAGE, request)
        assert record["step"] == 4 and record["weights_version"] == 3 and record["resumes"] == []


def test_commit_copies_the_callers_buffer(store_config):
    store = RunStore.open(store_config)
    buf = np.ones(SHAPE, np.float32)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, buf, num_steps=2, weights_version=0)
        buf[:] = 7.0  # the sampler reuses its buffer right away
        sink.commit("r", 1, buf, num_steps=2, weights_version=0)
    traj = store.read_trajectory(STAGE, "r")
    assert np.all(traj[0] == 1.0) and np.all(traj[1] == 7.0)


def test_all_zero_latent_is_committed_not_treated_as_empty(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        sink.commit("z", 0, np.zeros(SHAPE, np.float32), num_steps=1, weights_version=0)
    point = store.resume_point(STAGE, "z")
    assert point.step == 0 and np.all(point.latent == 0.0)


def test_resume_after_interruption_is_bit_identical(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        final_plain = run_request(sink, "plain", seed=11, num_steps=8)
    # A worker commits steps 0..3 of the same request, then is preempted.
    with store.latent_sink(STAGE) as sink:
        run_request(sink, "preempted", seed=11, num_steps=8, stop=3)
    point = store.resume_point(STAGE, "preempted")
    assert isinstance(point, ResumePoint)
    step, latent, version = point
    assert (step, version) == (3, 3)
    # Another worker resumes from the committed step.
    with store.latent_sink(STAGE) as sink:
        final_resumed = run_request(sink, "preempted", seed=11, num_steps=8, start=point)
    assert final_resumed.tobytes() == final_plain.tobytes()
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "preempted"),
                                  store.read_trajectory(STAGE, "plain"))
    assert store.latents.commit_record(STAGE, "preempted")["resumes"] == [3]


def test_an_attempt_overtaken_by_its_twin_stops_and_leaves_the_twins_steps(store_config):
    """Two attempts of one request resume from step 3; one commits through step 6 first. The
    other's stream then starts behind the store: it is told it was overtaken (a stop, not a
    failure of the run) and writes nothing over the twin's steps."""
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        run_request(sink, "r", seed=5, num_steps=8, stop=3)
    point = store.resume_point(STAGE, "r")
    with store.latent_sink(STAGE) as sink:
        run_request(sink, "r", seed=5, num_steps=8, start=point, stop=6, attempt=Attempt(0, 2))
    ahead = store.resume_point(STAGE, "r")
    late = store.latent_sink(STAGE)
    with pytest.raises(StreamOvertakenError, match=r"another attempt owns .* \(committed "
                                                   r"through step 6\); attempt e0a3 would start"):
        run_request(late, "r", seed=5, num_steps=8, start=point, attempt=Attempt(0, 3))
        late.flush()
    late.close(raise_errors=False)
    after = store.resume_point(STAGE, "r")
    assert isinstance(late.error, StreamOvertakenError)
    assert after.step == 6 and after.latent.tobytes() == ahead.latent.tobytes()


def test_a_twin_behind_never_moves_the_marker_back(store_config):
    """A slow attempt has committed step 4; its twin resumes from there and finishes the
    request; then the slow one commits step 5 and is stopped (a spot worker's notice). The
    marker must still say the request is finished: a stage that accepted the twin's result
    reads all its steps."""
    store = RunStore.open(store_config)
    slow = store.latent_sink(STAGE)
    run_request(slow, "r", seed=5, num_steps=8, stop=4)
    slow.flush()
    latent = store.resume_point(STAGE, "r").latent
    with store.latent_sink(STAGE) as fast:
        run_request(fast, "r", seed=5, num_steps=8, start=store.resume_point(STAGE, "r"),
                    attempt=Attempt(0, 2))
    slow.commit("r", 5, toy_step(latent, 5, 4), num_steps=8, weights_version=3)
    with pytest.raises(StreamOvertakenError,
                       match=r"attempt e0a2 took .* over \(committed through step 8\); attempt "
                             r"e0a1 stops at step 5"):
        slow.flush()
    slow.close(raise_errors=False)
    assert store.latents.committed_step(STAGE, "r") == 8
    assert store.read_trajectory(STAGE, "r").shape == (9, *SHAPE)


def test_half_written_chunk_is_not_committed(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        run_request(sink, "r", seed=1, num_steps=6, stop=2)
    # Simulate a crash after the chunk of step 3 was (partly) written but before its marker.
    loc = store.location
    parts = ("iter-000003/rollout.zarr", "latents", "r", "latent", "c", "3", "0", "0")
    loc.write_bytes(b"\x00garbage", *parts)
    point = store.resume_point(STAGE, "r")
    assert point.step == 2
    with pytest.raises(NotCommittedError, match="committed through step 2"):
        store.latents.read_steps(STAGE, "r", 0, 4)
    with store.latent_sink(STAGE) as sink:  # resuming overwrites the garbage
        run_request(sink, "r", seed=1, num_steps=6, start=point)
    assert store.latents.committed_step(STAGE, "r") == 6


def test_no_commit_means_no_resume_point(store_config):
    store = RunStore.open(store_config)
    assert store.resume_point(STAGE, "never") is None
    assert store.latents.committed_step(STAGE, "never") == -1


def test_out_of_order_and_gaps_are_refused(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=0)
        with pytest.raises(ValueError, match="consecutive"):
            sink.commit("r", 2, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=0)
        with pytest.raises(ValueError, match="num_steps"):
            sink.commit("q", 5, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=0)
    # A new stream that does not continue from the committed step fails in the background,
    # and flush() hands the error to the caller.
    sink = store.latent_sink(STAGE)
    sink.commit("r", 3, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=0)
    with pytest.raises(StorageError, match="resume from resume_point"):
        sink.flush()
    with pytest.raises(StorageError):  # the sink stays failed
        sink.commit("other", 0, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=0)
    sink.close(raise_errors=False)
    assert store.latents.committed_step(STAGE, "r") == 0


def test_resume_with_other_weights_or_shape_is_refused(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=1)
    sink = store.latent_sink(STAGE)
    sink.commit("r", 1, np.zeros(SHAPE, np.float32), num_steps=4, weights_version=2)
    with pytest.raises(StorageError, match="weights version"):
        sink.flush()
    sink.close(raise_errors=False)
    sink = store.latent_sink(STAGE)
    sink.commit("r", 1, np.zeros((3, 3), np.float32), num_steps=4, weights_version=1)
    with pytest.raises(StorageError, match="shape"):
        sink.close()


def test_corrupted_chunk_names_the_object(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        run_request(sink, "r", seed=5, num_steps=4)
    parts = ("iter-000003/rollout.zarr", "latents", "r", "latent", "c", "2", "0", "0")
    data = bytearray(store.location.read_bytes(*parts))
    data[10] ^= 0xFF
    store.location.write_bytes(bytes(data), *parts)
    with pytest.raises(CorruptObjectError, match=r"latents/r/latent/c/2/0/0") as info:
        store.read_trajectory(STAGE, "r")
    assert info.value.url.startswith(store.url)
    store.location.remove(*parts)  # a committed chunk that vanished is an error, not NaNs
    with pytest.raises(CorruptObjectError, match="missing"):
        store.read_trajectory(STAGE, "r")
    # The intact steps stay readable.
    np.testing.assert_array_equal(store.latents.read_steps(STAGE, "r", 3, 5)[1],
                                  store.resume_point(STAGE, "r").latent)


def test_damaged_commit_marker_names_the_object(store_config):
    store = RunStore.open(store_config)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=1, weights_version=0)
    store.location.write_bytes(b"{not json", "iter-000003/rollout.commits", "r.json")
    with pytest.raises(CorruptObjectError, match="rollout.commits/r.json"):
        store.resume_point(STAGE, "r")


def test_bounded_queue_applies_back_pressure(monkeypatch):
    store = RunStore.open("memory://spotlight-tests/backpressure")
    gate = threading.Event()
    real_write = store.latents.write_step

    def blocked_write(*args, **kwargs):
        gate.wait()
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store.latents, "write_step", blocked_write)
    sink = store.latent_sink("iter-0/explore", queue_size=2)
    latent = np.zeros(SHAPE, np.float32)
    done = threading.Event()

    def producer():
        for t in range(6):
            sink.commit("r", t, latent, num_steps=5, weights_version=0)
        done.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    thread.join(timeout=0.5)
    assert not done.is_set(), "commit() must block while the bounded queue is full"
    assert sink._queue.full()
    gate.set()
    thread.join()
    sink.close()
    assert store.latents.committed_step("iter-0/explore", "r") == 5


def test_closed_sink_refuses_commits():
    store = RunStore.open("memory://spotlight-tests/closed")
    sink = store.latent_sink(STAGE)
    sink.close()
    with pytest.raises(SinkClosedError):
        sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=1, weights_version=0)


def test_bad_inputs_are_refused_up_front():
    store = RunStore.open("memory://spotlight-tests/bad-inputs")
    with store.latent_sink() as sink:
        with pytest.raises(ValueError, match="stage"):
            sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=1, weights_version=0)
        with pytest.raises(ValueError, match="request id"):
            sink.commit("a/b", 0, np.zeros(SHAPE), num_steps=1, weights_version=0, stage=STAGE)
        with pytest.raises(TypeError, match="numeric"):
            sink.commit("r", 0, np.array(["x"]), num_steps=1, weights_version=0, stage=STAGE)
    with pytest.raises(ValueError, match="part"):
        store.resume_point("iter-3/../etc", "r")


def test_two_workers_start_the_same_new_stage_at_once(store_config):
    """Workers race to create a stage's Zarr groups; both must succeed, and a third process
    sees every commit after flush()."""
    stores = [RunStore.open(store_config) for _ in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(w: int) -> None:
        try:
            with stores[w].latent_sink("iter-7/explore") as sink:
                barrier.wait()
                for r in range(3):
                    sink.commit(f"w{w}-r{r}", 0, np.full(SHAPE, w, np.float32), num_steps=1,
                                weights_version=7)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    reader = RunStore.open(store_config, create=False)
    assert reader.requests("iter-7/explore") == [f"w{w}-r{r}" for w in range(2) for r in range(3)]
    for w in range(2):
        assert np.all(reader.resume_point("iter-7/explore", f"w{w}-r2").latent == w)


def _count_markers(monkeypatch, store) -> list:
    written: list = []
    real = store.latents.write_commit

    def counting(stage, request, record, version):
        new = real(stage, request, record, version)
        written.append(record["step"])
        return new

    monkeypatch.setattr(store.latents, "write_commit", counting)
    return written


def _wait_for_step(store, request, step, timeout=10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.latents.committed_step(STAGE, request) == step:
            return True
        time.sleep(0.02)
    return False


def test_markers_are_coalesced_and_flush_commits_everything(monkeypatch):
    store = RunStore.open("memory://spotlight-tests/coalesced")
    markers = _count_markers(monkeypatch, store)
    sink = store.latent_sink(STAGE, commit_interval_s=600)
    latent = np.ones(SHAPE, np.float32)
    for t in range(4):
        sink.commit("r", t, latent * t, num_steps=8, weights_version=0)
    sink.flush()  # held-back markers are written now, covering every written step
    assert store.latents.committed_step(STAGE, "r") == 3 and markers == [3]
    for t in range(4, 9):  # the final step commits at once, without a flush
        sink.commit("r", t, latent * t, num_steps=8, weights_version=0)
    assert _wait_for_step(store, "r", 8)
    assert markers == [3, 8]
    sink.close()
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r")[:, 0, 0], np.arange(9.0))


def test_held_back_marker_is_written_when_due_without_flush(monkeypatch):
    store = RunStore.open("memory://spotlight-tests/due")
    markers = _count_markers(monkeypatch, store)
    with store.latent_sink(STAGE, commit_interval_s=0.1) as sink:
        sink.commit("r", 0, np.zeros(SHAPE, np.float32), num_steps=5, weights_version=0)
        sink.commit("r", 1, np.ones(SHAPE, np.float32), num_steps=5, weights_version=0)
        assert _wait_for_step(store, "r", 1)  # the producer went quiet; the marker still came
        assert markers == [1]


def test_uncommitted_array_of_an_earlier_attempt_is_replaced(store_config):
    store = RunStore.open(store_config)
    store.latents.prepare_stage(STAGE)
    # A worker created the array (another shape) and died before committing anything.
    store.latents.open_for_write(STAGE, "r", num_steps=2, shape=(3, 3), dtype=np.dtype("float64"),
                                 weights_version=9)
    with store.latent_sink(STAGE) as sink:
        final = run_request(sink, "r", seed=5, num_steps=3)
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r")[-1], final)
    assert store.resume_point(STAGE, "r").weights_version == 3
