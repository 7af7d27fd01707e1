"""The rollout's layout in the run store: requests written by their workers, one index, and
runs written in the earlier layout (everything in rollout.npz) read as they are."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.run import rollout_store
from storage import NotCommittedError, RunStore
from storage.attempts import FIRST, Attempt

STAGE = "iter-2/rollout"
STEPS, BATCH, TOKENS, CHANNELS = 4, 3, 5, 2


def stream(store: RunStore, request: str, latents: np.ndarray) -> None:
    """Commit a request's latents (step, batch, tokens, channels) as a worker streams them."""
    with store.latent_sink(STAGE) as sink:
        for step, latent in enumerate(latents):
            sink.commit(request, step, latent, num_steps=STEPS - 1, weights_version=2)


def request_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    latents = rng.standard_normal((STEPS, BATCH, TOKENS, CHANNELS)).astype(np.float32)
    return rng.standard_normal((BATCH, STEPS - 1)).astype(np.float32), latents


def test_streamed_requests_read_back_in_the_index_order_not_the_listing_order(tmp_path):
    store = RunStore.open(str(tmp_path / "run"))
    # Written in any order by their workers; the index says the rollout's order.
    parts = {name: request_data(seed) for seed, name in enumerate(["p0004", "p0000"])}
    files = {}
    for name, (log_probs, latents) in parts.items():
        stream(store, name, latents)
        files[name] = rollout_store.save_request(store, STAGE, name, FIRST, log_probs)
    rollout_store.write_index(store, STAGE, ["p0004", "p0000"], [files["p0004"], files["p0000"]],
                              np.arange(12).reshape(6, 2))

    log_probs, latents = rollout_store.read_rollout(store, STAGE)
    np.testing.assert_array_equal(
        log_probs, np.concatenate([parts["p0004"][0], parts["p0000"][0]]))
    np.testing.assert_array_equal(
        latents, np.concatenate([parts["p0004"][1], parts["p0000"][1]], axis=1).swapaxes(0, 1))
    assert latents.shape == (2 * BATCH, STEPS, TOKENS, CHANNELS)
    assert latents.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(store.get_arrays(STAGE, "rollout")["seeds"],
                                  np.arange(12).reshape(6, 2))


def test_unstreamed_latents_come_from_the_requests_own_files(tmp_path):
    store = RunStore.open(str(tmp_path / "run"))
    log_probs, latents = request_data(0)
    batch_first = latents.swapaxes(0, 1)
    file = rollout_store.save_request(store, STAGE, "p0000", FIRST, log_probs, batch_first)
    rollout_store.write_index(store, STAGE, ["p0000"], [file], np.zeros((3, 1)))
    got = rollout_store.read_rollout(store, STAGE)
    np.testing.assert_array_equal(got[0], log_probs)
    np.testing.assert_array_equal(got[1], batch_first)
    assert store.requests(STAGE) == []   # nothing was streamed


def test_a_run_in_the_earlier_layout_still_reads(tmp_path):
    store = RunStore.open(str(tmp_path / "run"))
    # All in rollout.npz, latents included (latents not streamed) ...
    log_probs, latents = request_data(1)
    store.put_arrays(STAGE, "rollout", {"log_probs": log_probs, "seeds": np.zeros((3, 1)),
                                        "latents": latents.swapaxes(0, 1)})
    got = rollout_store.read_rollout(store, STAGE)
    np.testing.assert_array_equal(got[0], log_probs)
    np.testing.assert_array_equal(got[1], latents.swapaxes(0, 1))
    # ... or streamed as one request named "batch" (before requests of grpo.request_prompts).
    other = "iter-5/rollout"
    with store.latent_sink(other) as sink:
        for step, latent in enumerate(latents):
            sink.commit(rollout_store.ROLLOUT_REQUEST, step, latent, num_steps=STEPS - 1,
                        weights_version=5)
    store.put_arrays(other, "rollout", {"log_probs": log_probs, "seeds": np.zeros((3, 1))})
    got = rollout_store.read_rollout(store, other)
    np.testing.assert_array_equal(got[1], latents.swapaxes(0, 1))


def test_a_request_the_index_names_but_the_store_lacks_is_a_clear_error(tmp_path):
    store = RunStore.open(str(tmp_path / "run"))
    log_probs, latents = request_data(0)
    file = rollout_store.save_request(store, STAGE, "p0000", FIRST, log_probs,
                                      latents.swapaxes(0, 1))
    rollout_store.write_index(store, STAGE, ["p0000", "p0002"],
                              [file, rollout_store.request_file("p0002", FIRST)], np.zeros((6, 1)))
    with pytest.raises(NotCommittedError, match="request-p0002"):
        rollout_store.read_rollout(store, STAGE)


def test_a_stale_attempt_finishing_late_never_replaces_the_accepted_log_probs(tmp_path):
    """Attempt 2 (the twin) is accepted; attempt 1 (cut off, still computing on different
    kernels) writes its log-probabilities afterwards. The rollout reads attempt 2's."""
    store = RunStore.open(str(tmp_path / "run"))
    log_probs, latents = request_data(0)
    accepted = rollout_store.save_request(store, STAGE, "p0000", Attempt(1, 2), log_probs,
                                          latents.swapaxes(0, 1))
    rollout_store.write_index(store, STAGE, ["p0000"], [accepted], np.zeros((3, 1)))
    rollout_store.save_request(store, STAGE, "p0000", Attempt(1, 1), log_probs + 1.0,
                               latents.swapaxes(0, 1) + 1.0)
    got = rollout_store.read_rollout(store, STAGE)
    np.testing.assert_array_equal(got[0], log_probs)
    np.testing.assert_array_equal(got[1], latents.swapaxes(0, 1))


def test_an_index_without_files_reads_the_requests_unscoped_files(tmp_path):
    """Runs written before attempts had their own files: ``request-<name>``."""
    store = RunStore.open(str(tmp_path / "run"))
    log_probs, latents = request_data(2)
    store.put_arrays(STAGE, "request-p0000", {"log_probs": log_probs,
                                              "latents": latents.swapaxes(0, 1)})
    store.put_arrays(STAGE, "rollout", {"requests": np.asarray(["p0000"]),
                                        "seeds": np.zeros((3, 1))})
    np.testing.assert_array_equal(rollout_store.read_rollout(store, STAGE)[0], log_probs)
