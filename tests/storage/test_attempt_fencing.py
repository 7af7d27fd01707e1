"""Attempt fencing: two live attempts of one request that compute *different* latents (as
non-deterministic GPU kernels would) never mix in the stored trajectory, on every backend."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from storage import RunStore, StreamOvertakenError
from storage.attempts import (
    LATENT,
    Attempt,
    array_name,
    attempt_of,
    claimed,
    fenced_by,
    lineage_of,
    segments,
)

STAGE = "iter-4/rollout"
SHAPE = (6, 3)
STEPS = 8


def kernel_step(latent: np.ndarray, t: int, kernel: int) -> np.ndarray:
    """A denoising step whose last bits depend on the attempt's ``kernel`` (a GPU's
    non-deterministic reduction order)."""
    noise = np.random.default_rng([7, t]).standard_normal(latent.shape).astype(np.float32)
    return (0.9 * latent + 0.05 * noise + 1e-3 * kernel).astype(np.float32)


def steps_of(kernel: int, start: np.ndarray, first: int, stop: int) -> dict[int, np.ndarray]:
    out, latent = {}, start
    for t in range(first, stop):
        latent = kernel_step(latent, t, kernel)
        out[t + 1] = latent
    return out


def noise() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)


# -- the owner record as pure functions ------------------------------------------------------------
def test_attempts_order_by_driver_epoch_then_number():
    assert Attempt(2, 1) > Attempt(1, 9) > Attempt(1, 2) > Attempt(1, 1)
    assert fenced_by({"step": 3, "attempt": [2, 1]}, Attempt(1, 9)) == Attempt(2, 1)
    assert fenced_by({"step": 3, "attempt": [1, 1]}, Attempt(1, 2)) is None
    assert fenced_by(None, Attempt(0, 1)) is None
    # A marker written before attempts were named is older than any attempt.
    assert fenced_by({"step": 3, "attempt": "9f2c"}, Attempt(0, 1)) is None
    assert attempt_of({"step": 3, "attempt": "9f2c"}) < Attempt(0, 0)


def test_a_claim_extends_the_lineage_and_segments_follow_it():
    start = claimed(None, Attempt(1, 1), 0, {"weights_version": 2})
    assert start["step"] == -1 and lineage_of(start) == [(0, LATENT)]
    took = claimed({**start, "step": 3}, Attempt(1, 2), 4, {})
    assert lineage_of(took) == [(0, LATENT), (4, "latent-e1a2")]
    assert took["attempt"] == [1, 2] and took["step"] == 3
    assert segments(lineage_of(took), 0, 9) == [(LATENT, 0, 4), ("latent-e1a2", 4, 9)]
    assert segments(lineage_of(took), 5, 7) == [("latent-e1a2", 5, 7)]
    # The owner continuing its own lineage adds nothing.
    assert lineage_of(claimed(took, Attempt(1, 2), 6, {})) == lineage_of(took)
    # An attempt that claimed and committed nothing leaves no entry behind.
    empty = claimed(start, Attempt(1, 3), 0, {})
    assert lineage_of(empty) == [(0, "latent-e1a3")]
    assert array_name(Attempt(3, 4), starts_request=False) == "latent-e3a4"


# -- two attempts against a real store ---------------------------------------------------------
def test_a_zombie_attempts_late_steps_never_enter_the_trajectory(store_config):
    """Attempt 1 commits steps 0..3 and is given up (cut off); attempt 2 takes over at step 3
    and finishes; then attempt 1, still computing with its own kernels, writes steps 4 and 5.
    The trajectory is attempt 1's steps 0..3 and attempt 2's 4..8; attempt 1 is told it was
    overtaken; a resume finds attempt 2's last step."""
    store = RunStore.open(store_config)
    first, second = Attempt(1, 1), Attempt(1, 2)
    zombie = store.latent_sink(STAGE)
    zombie.commit("r", 0, noise(), num_steps=STEPS, weights_version=1, attempt=first)
    mine = steps_of(kernel=1, start=noise(), first=0, stop=STEPS)
    for t in range(1, 4):
        zombie.commit("r", t, mine[t], num_steps=STEPS, weights_version=1, attempt=first)
    zombie.flush()

    point = store.resume_point(STAGE, "r")
    assert point.step == 3
    theirs = steps_of(kernel=2, start=point.latent, first=3, stop=STEPS)
    with store.latent_sink(STAGE) as winner:
        for t in range(4, STEPS + 1):
            winner.commit("r", t, theirs[t], num_steps=STEPS, weights_version=1, attempt=second)

    with pytest.raises(StreamOvertakenError, match=r"attempt e1a2 took .* over \(committed "
                                                   r"through step 8\); attempt e1a1 stops"):
        for t in (4, 5):
            zombie.commit("r", t, mine[t], num_steps=STEPS, weights_version=1, attempt=first)
        zombie.flush()
    zombie.close(raise_errors=False)

    expected = np.stack([noise()] + [mine[t] for t in range(1, 4)]
                        + [theirs[t] for t in range(4, STEPS + 1)])
    np.testing.assert_array_equal(store.read_trajectory(STAGE, "r"), expected)
    record = store.latents.commit_record(STAGE, "r")
    assert record["attempt"] == [1, 2] and record["step"] == STEPS
    assert lineage_of(record) == [(0, LATENT), (4, "latent-e1a2")]
    # The zombie's late chunk is in its own array, outside the lineage.
    late = store.latents._read_array(STAGE, "r", LATENT, 4, 5)[0]
    np.testing.assert_array_equal(late, mine[4])
    assert not np.array_equal(late, theirs[4])


def test_an_older_attempt_never_claims_a_request_a_newer_one_owns(store_config):
    """Attempt 3 took over at step 2; attempt 2, dispatched earlier but slow to start, then
    begins from the same step: it is stopped before it writes anything."""
    store = RunStore.open(store_config)
    lat = steps_of(kernel=0, start=noise(), first=0, stop=STEPS)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, noise(), num_steps=STEPS, weights_version=1, attempt=Attempt(1, 1))
        for t in (1, 2):
            sink.commit("r", t, lat[t], num_steps=STEPS, weights_version=1, attempt=Attempt(1, 1))
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 3, lat[3], num_steps=STEPS, weights_version=1, attempt=Attempt(1, 3))
    before = store.latents.commit_record(STAGE, "r")
    late = store.latent_sink(STAGE)
    late.commit("r", 3, lat[3] + 1, num_steps=STEPS, weights_version=1, attempt=Attempt(1, 2))
    with pytest.raises(StreamOvertakenError, match="attempt e1a3 owns"):
        late.flush()
    late.close(raise_errors=False)
    assert store.latents.commit_record(STAGE, "r") == before
    assert store.latents._chunk_keys(STAGE, "r", "latent-e1a2") == set()
    # A new driver's attempt (epoch 2) outranks every attempt of the old one.
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 4, lat[4], num_steps=STEPS, weights_version=1, attempt=Attempt(2, 1))
    assert store.latents.commit_record(STAGE, "r")["attempt"] == [2, 1]
    assert lineage_of(store.latents.commit_record(STAGE, "r"))[-1] == (4, "latent-e2a1")


def test_racing_attempts_with_different_kernels_leave_one_lineage(racing_config):
    """Two attempts stream the same request at once from step 2, each with its own kernel.
    However they interleave, the stored trajectory follows its lineage: every step equals
    the step its lineage's attempt computed from the previous stored step."""
    store = RunStore.open(racing_config)
    base = steps_of(kernel=0, start=noise(), first=0, stop=2)
    with store.latent_sink(STAGE) as sink:
        sink.commit("r", 0, noise(), num_steps=STEPS, weights_version=1, attempt=Attempt(1, 1))
        for t in (1, 2):
            sink.commit("r", t, base[t], num_steps=STEPS, weights_version=1,
                        attempt=Attempt(1, 1))
    outcomes: dict[int, BaseException | None] = {}

    def attempt(number: int) -> None:
        sink = store.latent_sink(STAGE, queue_size=1)
        try:
            for t, latent in steps_of(number, base[2], 2, STEPS).items():
                sink.commit("r", t, latent, num_steps=STEPS, weights_version=1,
                            attempt=Attempt(1, number))
                sink.flush()
            outcomes[number] = None
        except StreamOvertakenError as exc:
            outcomes[number] = exc
        finally:
            sink.close(raise_errors=False)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in (2, 3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()

    record = store.latents.commit_record(STAGE, "r")
    traj = store.read_trajectory(STAGE, "r")
    assert record["step"] == STEPS and len(traj) == STEPS + 1
    kernel = {LATENT: 0, "latent-e1a2": 2, "latent-e1a3": 3}   # who wrote each array
    lineage = lineage_of(record)
    assert lineage[0] == (0, LATENT) and lineage[-1][0] == 3 and len(lineage) == 2
    for t in range(1, STEPS + 1):
        array = segments(lineage, t, t + 1)[0][0]
        np.testing.assert_array_equal(traj[t], kernel_step(traj[t - 1], t - 1, kernel[array]))
    # Attempt 3 is newer: it finished, or attempt 2 finished the request before 3 began.
    assert outcomes[3] is None or record["attempt"] == [1, 2]
    assert any(out is None for out in outcomes.values())
