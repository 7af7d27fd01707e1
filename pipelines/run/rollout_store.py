"""Where an iteration's rollout lives in the run store, whichever backend computed it.

Each rollout request is written by the worker that computed it: its latents stream to
``iter-K/rollout.zarr/latents/<request>`` as it samples, and its log-probabilities go to
``iter-K/rollout/request-<request>-<attempt>.npz`` when it finishes (with its latents too when
latents are not streamed). Each attempt writes its own file, so a stale attempt that finishes
late never replaces the accepted one's. ``rollout.npz`` is the stage's index -- the requests in
order, the file of each request's accepted attempt, and the seeds -- written once by
:func:`pipelines.run.rollout.finish_rollout` when every request is in: only names travel through
the driver, never trajectories.

Runs written before this layout kept everything in ``rollout.npz`` (log-probabilities, and
latents when not streamed); :func:`read_rollout` reads them as they are, so they still resume.
"""
from __future__ import annotations

import numpy as np

from storage import RunStore
from storage.attempts import Attempt

ROLLOUT_REQUEST = "batch"   # runs before grpo.request_prompts streamed one request, the whole batch


def request_file(request: str, attempt: Attempt) -> str:
    """The object an attempt of a request writes its log-probabilities to."""
    return f"request-{request}-{attempt.key}"


def save_request(store: RunStore, stage: str, request: str, attempt: Attempt,
                 log_probs: np.ndarray, latents: np.ndarray | None = None) -> str:
    """One finished attempt's log-probabilities (and latents, when not streamed); the name
    of the object they are in."""
    arrays = {"log_probs": log_probs} if latents is None else \
        {"log_probs": log_probs, "latents": latents}
    name = request_file(request, attempt)
    store.put_arrays(stage, name, arrays)
    return name


def write_index(store: RunStore, stage: str, requests: list[str], files: list[str],
                seeds: np.ndarray) -> None:
    """The stage's index: every request is in the store by now, each in ``files`` (its
    accepted attempt's)."""
    store.put_arrays(stage, "rollout", {"requests": np.asarray(requests, dtype=str),
                                        "files": np.asarray(files, dtype=str),
                                        "seeds": np.asarray(seeds)})


def read_rollout(store: RunStore, stage: str) -> tuple[np.ndarray, np.ndarray]:
    """The rollout's log-probabilities (batch, step) and latents (batch, step, ...), with the
    requests' samples in order."""
    index = store.get_arrays(stage, "rollout")
    if "requests" not in index:   # the earlier layout: all in rollout.npz
        names = None
        log_probs, latents = index["log_probs"], index.get("latents")
    else:
        names = [str(n) for n in index["requests"]]
        files = [str(f) for f in index["files"]] if "files" in index else \
            [f"request-{n}" for n in names]   # before attempts had their own files
        parts = [store.get_arrays(stage, f) for f in files]
        log_probs = np.concatenate([p["log_probs"] for p in parts])
        latents = np.concatenate([p["latents"] for p in parts]) if "latents" in parts[0] \
            else None
    if latents is None:   # streamed: one stream per request, in order
        if names is None:
            listed = store.requests(stage)   # listed once: one round trip
            names = [ROLLOUT_REQUEST] if ROLLOUT_REQUEST in listed else sorted(listed)
        streams = [np.asarray(store.read_trajectory(stage, n)) for n in names]
        latents = np.concatenate(streams, axis=1).swapaxes(0, 1)   # stored (step, batch, ...)
    return log_probs, np.ascontiguousarray(latents)
