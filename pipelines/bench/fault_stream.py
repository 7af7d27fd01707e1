"""One attempt of one request, streamed to a run store from its own process (a test-bed host):
the zombie scenario of ``spotlight bench faults`` runs two of these against one request.

Each step is a toy denoising step whose last bits depend on ``--kernel`` -- two attempts of a
request on GPUs with non-deterministic kernels compute such different values. The attempt
commits every step through the run store's latent sink (the path every Spotlight request
takes), and prints one line per event on stdout::

    claimed 3          resumed after committed step 3 (or "claimed -1": it starts the request)
    step 4 1732712345.123
    fenced 1732712350.456 <message>     a newer attempt took the request over: it stopped
    done 1732712351.789

    python -m pipelines.bench.fault_stream URL REQUEST --epoch 1 --number 2 --kernel 2
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from storage import RunStore, StreamOvertakenError
from storage.attempts import Attempt

STAGE = "iter-0/rollout"
SHAPE = (16, 8)


def kernel_step(latent: np.ndarray, t: int, kernel: int) -> np.ndarray:
    """Step ``t`` -> ``t + 1``: the same noise for every attempt, the kernel's own last bits."""
    noise = np.random.default_rng([11, t]).standard_normal(latent.shape).astype(np.float32)
    return (0.9 * latent + 0.05 * noise + 1e-4 * kernel).astype(np.float32)


def initial_noise() -> np.ndarray:
    return np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)


def expected(kernels: list[tuple[int, int]], steps: int) -> np.ndarray:
    """The trajectory of a lineage: ``[(first step, kernel), ...]``."""
    out, latent = [initial_noise()], initial_noise()
    for t in range(steps):
        kernel = [k for first, k in kernels if first <= t + 1][-1]
        latent = kernel_step(latent, t, kernel)
        out.append(latent)
    return np.stack(out)


def stream(url: str, request: str, attempt: Attempt, kernel: int, steps: int,
           step_s: float) -> int:
    store = RunStore.open(url, create=False)
    point = store.resume_point(STAGE, request)
    start, latent = (0, initial_noise()) if point is None else (point.step, point.latent)
    print(f"claimed {start if point is not None else -1}", flush=True)
    sink = store.latent_sink(STAGE, queue_size=1)
    try:
        if point is None:
            sink.commit(request, 0, latent, num_steps=steps, weights_version=0, attempt=attempt)
        for t in range(start, steps):
            time.sleep(step_s)
            latent = kernel_step(latent, t, kernel)
            sink.commit(request, t + 1, latent, num_steps=steps, weights_version=0,
                        attempt=attempt)
            sink.flush()
            print(f"step {t + 1} {time.time():.3f}", flush=True)
        sink.close()
    except StreamOvertakenError as exc:
        sink.close(raise_errors=False)
        print(f"fenced {time.time():.3f} {exc}", flush=True)
        return 0
    print(f"done {time.time():.3f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("request")
    p.add_argument("--epoch", type=int, default=1)
    p.add_argument("--number", type=int, required=True)
    p.add_argument("--kernel", type=int, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-s", type=float, default=0.2)
    args = p.parse_args(argv)
    return stream(args.url, args.request, Attempt(args.epoch, args.number), args.kernel,
                  args.steps, args.step_s)


if __name__ == "__main__":
    sys.exit(main())
