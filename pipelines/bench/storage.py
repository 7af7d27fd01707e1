"""``spotlight bench storage``: what does streaming every denoising step to the run store cost?

One request is a fixed batch (the config's prompts_per_iteration x group_size samples). The
same batch, with the same seeds, is denoised with streaming off and on -- to ``file://`` and to
``s3://`` on a moto server this benchmark starts on loopback as its own process, so its CPU time
can be read from ``/proc`` -- in interleaved repetitions: each "on" run is divided by the mean
of the "off" runs either side of it, and the ratio reported is the median of those. Each step's
latent is one ``LatentSink.commit`` (one chunk per step per request, the sink's default marker
coalescing); the timed "on" run includes the final flush. A request cut at a seeded random
step and resumed from its ``resume_point`` by a freshly opened store must equal the
uninterrupted one bit for bit.

A random-init policy is used: the benchmark measures I/O overhead, not image quality.
"""
from __future__ import annotations

import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from pipelines.bench.registry import machine, register_bench
from spotlight.config import load_config, shipped_config
from spotlight.models.base import build_policy
from spotlight.models.prompts import world_prompts
from spotlight.rl.sampler import initial_latents, sample
from spotlight.rl.trainer import iteration_prompts, random_seeds, sample_keys
from storage import LatentSink, RunStore, StorageConfig

DEFAULT_CONFIG = shipped_config("digits.yaml")
STAGE = "iter-0/rollout"
BUCKET = "spotlight-bench"
_S3_ENV = {
    # Newer botocore sends checksums some S3 emulators reject (see DESIGN, known hazards).
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
# The server process: moto's S3 on loopback, without werkzeug's per-request access log.
_MOTO_MAIN = ("import logging, sys; logging.getLogger('werkzeug').setLevel(logging.ERROR); "
              "from moto.server import main; main(sys.argv[1:])")


class _Preempted(Exception):
    """Raised inside the sampler's step callback to cut a request, as a preemption would."""


# -- the moto server, as a separate process ------------------------------------------------------
class MotoProcess:
    """moto's S3 server on 127.0.0.1 in a child process, so its CPU time is measurable."""

    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port, self.proc = port, proc

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        """User + system CPU seconds the server has used so far."""
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def moto_process(timeout_s: float = 60.0, atomic: bool = False) -> Iterator[MotoProcess]:
    """Start moto's server on a free loopback port, wait until it answers, stop it at exit.
    ``atomic``: with S3's atomic conditional PUTs (:mod:`pipelines.bench.serial_s3`), for
    leases and commit markers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    main = ["-m", "pipelines.bench.serial_s3", "127.0.0.1", str(port)] if atomic \
        else ["-c", _MOTO_MAIN, "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen([sys.executable, *main],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **_S3_ENV})
    server = MotoProcess(port, proc)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with code {proc.returncode} at start; "
                                   "is moto[server] installed (pip install 'moto[server]')?")
            try:
                urllib.request.urlopen(server.endpoint + "/moto-api/", timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server on port {port} did not answer within "
                                       f"{timeout_s:.0f}s")
                time.sleep(0.1)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def s3_environment() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in _S3_ENV}
    os.environ.update(_S3_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- one request: a fixed batch ------------------------------------------------------------------
class Request:
    """The benchmark's request: policy, prompts and keys of one fixed batch."""

    def __init__(self, cfg: Any, batch: int | None) -> None:
        torch.manual_seed(cfg.seed)
        self.policy = build_policy(cfg).eval()
        self.sampler = cfg.sampler
        grpo = cfg.grpo
        groups, group = grpo.prompts_per_iteration, grpo.group_size
        if batch is not None:  # keep whole groups where possible
            group = min(group, batch)
            groups = max(1, batch // group)
        pool = world_prompts(cfg, "train")
        prompts = iteration_prompts(pool, 0, groups, cfg.seed)
        seeds = random_seeds(cfg.seed, 0, groups, group)
        self.texts = [p.text for p in prompts for _ in range(group)]
        self.keys = sample_keys(cfg.seed, prompts, seeds)
        self.num_steps = cfg.sampler.num_steps

    @property
    def size(self) -> int:
        return len(self.keys)

    def run(self, sink: LatentSink | None = None, name: str | None = None, *,
            start_step: int = 0, start_latents: torch.Tensor | None = None,
            cut_after: int | None = None) -> torch.Tensor:
        """Denoise the batch, streaming each step's latent to ``sink`` as request ``name``.

        ``cut_after=c`` stops (raises :class:`_Preempted`) once step c is committed.
        """
        if start_latents is None:
            start_latents = initial_latents(self.keys, self.policy.tokens_shape)
        on_step = None
        if sink is not None:
            def commit(step: int, x: torch.Tensor) -> None:
                sink.commit(name, step, x, num_steps=self.num_steps, weights_version=0)
                if cut_after is not None and step >= cut_after:
                    raise _Preempted(step)

            if start_step == 0:
                commit(0, start_latents)
            on_step = lambda t, x: commit(t + 1, x)  # noqa: E731 - storage step t+1 = after step t
        return sample(self.policy, self.texts, self.keys, self.sampler, mode="sde",
                      start_step=start_step, start_latents=start_latents, on_step=on_step).final


# -- measurements --------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any]) -> tuple[float, float, float, Any]:
    """(wall seconds, this process's CPU seconds, this thread's CPU seconds, result) of ``fn()``."""
    wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    result = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - own,
            result)


def _streamed(request: Request, sink: LatentSink, name: str) -> torch.Tensor:
    final = request.run(sink, name)
    sink.flush()  # the "on" time includes committing the last step
    return final


def _resume_identical(request: Request, store: RunStore, reference: torch.Tensor,
                      cut: int) -> dict[str, Any]:
    """Cut a request after committed step ``cut``, resume it from a freshly opened store (as
    another worker would), and compare with the uninterrupted run bit for bit."""
    name = f"cut-{uuid.uuid4().hex[:8]}"
    with store.latent_sink(STAGE) as sink:
        try:
            request.run(sink, name, cut_after=cut)
            raise AssertionError(f"request was not cut after step {cut}")
        except _Preempted:
            pass
    worker = RunStore.open(store.config, create=False)
    point = worker.resume_point(STAGE, name)
    with worker.latent_sink(STAGE) as sink:
        final = request.run(sink, name, start_step=point.step,
                            start_latents=torch.from_numpy(point.latent))
    trajectory = worker.read_trajectory(STAGE, name)
    record = worker.latents.commit_record(STAGE, name)
    return {"cut_step": cut, "resumed_at": point.step,
            "final_identical": bool(torch.equal(final, reference)),
            "stored_final_identical": bool(np.array_equal(trajectory[-1], reference.numpy())),
            "recorded_resumes": record.get("resumes", [])}


def _interleave(request: Request, sinks: dict[str, LatentSink], server: MotoProcess,
                reference: torch.Tensor, reps: int, say: Callable[..., None]) -> dict[str, Any]:
    """``reps`` rounds of off/file/off/s3 (file and s3 swapping places each round), then a
    last off. Each "on" run sits between two "off" runs and is compared with their mean, so
    drifts of the machine's load cancel in the ratio."""
    times: dict[str, list[float]] = {"off": [], "file": [], "s3": []}
    cpu: dict[str, list[float]] = {"off": [], "file": [], "s3": []}
    waited: dict[str, list[float]] = {"off": [], "file": [], "s3": []}
    sequence: list[tuple[str, float]] = []
    server_share: list[float] = []

    def run(mode: str, rep: int) -> None:
        if mode == "off":
            wall, used, own, final = _timed(request.run)
        else:
            server_cpu = server.cpu_s()
            wall, used, own, final = _timed(
                lambda: _streamed(request, sinks[mode], f"rep{rep}-{mode}"))
            if mode == "s3":
                server_share.append((server.cpu_s() - server_cpu) / wall)
        if not torch.equal(final, reference):
            raise AssertionError(f"rep {rep} ({mode}): the batch is not reproducible")
        times[mode].append(wall)
        cpu[mode].append(used)
        waited[mode].append(wall - own)
        sequence.append((mode, wall))

    for rep in range(reps):
        for mode in ("off", "file", "off", "s3") if rep % 2 == 0 else ("off", "s3", "off", "file"):
            run(mode, rep)
        say(f"rep {rep}: off={times['off'][-1]:.3f}s file={times['file'][-1]:.3f}s "
            f"s3={times['s3'][-1]:.3f}s", flush=True)
    run("off", reps)
    paired: dict[str, list[float]] = {"file": [], "s3": []}
    for i, (mode, wall) in enumerate(sequence):
        if mode != "off":
            paired[mode].append(wall / ((sequence[i - 1][1] + sequence[i + 1][1]) / 2))
    return {"times": times, "cpu": cpu, "waited": waited, "paired": paired,
            "server_share": server_share}


@register_bench("storage")
def bench_storage(quick: bool = False, config: str | None = None, reps: int | None = None,
                  batch: int | None = None, seed: int = 0, threads: int = 1,
                  progress: bool = True, **_: object) -> dict:
    """Streaming overhead (file, s3) and resume identity for one request of the config.

    ``threads`` torch threads, as a worker of the embedded cluster runs (one each): on a
    2-core machine shared with the sink, the S3 server and other work, two OpenMP threads
    spin at every barrier and the timings become noise.
    """
    started = time.perf_counter()
    cfg = load_config(config or DEFAULT_CONFIG)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _measure(cfg, quick, reps, batch, seed, threads, progress, started)
    finally:
        torch.set_num_threads(previous_threads)


def _measure(cfg: Any, quick: bool, reps: int | None, batch: int | None, seed: int,
             threads: int, progress: bool, started: float) -> dict:
    reps = reps or (3 if quick else 15)
    request = Request(cfg, batch if batch is not None else (4 if quick else None))
    say = print if progress else (lambda *a, **k: None)
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-") as tmp, s3_environment(), \
            moto_process() as server:
        stores = {
            "file": RunStore.open(f"file://{tmp}/run"),
            "s3": RunStore.open(StorageConfig(
                url=f"s3://{BUCKET}/runs/{uuid.uuid4().hex[:12]}", endpoint_url=server.endpoint,
                key="bench-key", secret="bench-secret", region="us-east-1", create_bucket=True)),
        }
        sinks = {k: s.latent_sink(STAGE) for k, s in stores.items()}
        reference = request.run()  # warm-up (allocator, first-call paths), and the reference
        for backend in ("file", "s3"):
            _streamed(request, sinks[backend], f"warmup-{backend}")
        runs = _interleave(request, sinks, server, reference, reps, say)
        for sink in sinks.values():
            sink.close()
        cut = random.Random(seed).randint(1, request.num_steps - 1)
        resume = {k: _resume_identical(request, s, reference, cut) for k, s in stores.items()}
        chunk = next(Path(tmp, "run").rglob("/".join(["c", "1", *["0"] * reference.dim()])))
        stored_chunk_bytes = chunk.stat().st_size
    return _figures(cfg, request, runs, resume, reference, reps, threads, stored_chunk_bytes,
                    stores["s3"].config.commit_interval_s, started)


def _figures(cfg: Any, request: "Request", runs: dict, resume: dict, reference: Any, reps: int,
             threads: int, stored_chunk_bytes: int, commit_interval_s: float,
             started: float) -> dict:
    """The benchmark's JSON from its measured runs."""
    times, median = runs["times"], statistics.median
    off = median(times["off"])
    bytes_per_step = int(reference.numel() * reference.element_size())
    return {
        "bench": "storage",
        "config": cfg.source,
        "batch": request.size,
        "num_steps": request.num_steps,
        "latent_shape": list(request.policy.tokens_shape),
        "reps": reps,
        "torch_threads": threads,
        "step_compute_s": off / request.num_steps,
        "batch_compute_s": off,
        "overhead_ratio_file": median(runs["paired"]["file"]),
        "overhead_ratio_s3": median(runs["paired"]["s3"]),
        "s3_server_cpu_share": median(runs["server_share"]),
        "s3_server_cpu_share_max": max(runs["server_share"]),
        "overhead_ratio_of_medians": {b: median(times[b]) / off for b in ("file", "s3")},
        "overhead_ratio_of_minimums": {b: min(times[b]) / min(times["off"])
                                       for b in ("file", "s3")},
        "commit_interval_s": commit_interval_s,
        "overhead_ratios": {b: [round(r, 4) for r in runs["paired"][b]] for b in ("file", "s3")},
        "client_cpu_s": {m: median(v) for m, v in runs["cpu"].items()},
        # Wall time the sampling thread spent off the CPU (waiting for a core, the GIL or the
        # final flush): streaming's cost, mostly free of the machine's speed swings.
        "main_thread_wait_s": {m: median(v) for m, v in runs["waited"].items()},
        "times_s": times,
        "resume_identical": all(r["final_identical"] and r["stored_final_identical"]
                                for r in resume.values()),
        "resume": resume,
        "bytes_per_step": bytes_per_step,
        "stored_chunk_bytes": stored_chunk_bytes,
        "commits_per_request": request.num_steps + 1,
        "s3_mb_per_s": bytes_per_step * (request.num_steps + 1) / median(times["s3"]) / 2**20,
        "machine": machine(),
        "wall_s": time.perf_counter() - started,
    }
