"""``spotlight bench scale``: what the control plane costs as the workers grow.

Weak scaling, so every size has the same ideal: per iteration each worker has 4 requests of 8
denoising steps of 0.5 s (16 s of work per worker, whatever their number; ``--quick``: steps
of 0.1 s), half the workers gpu and half spot, all pulling from one pool. The parts are the
product's: a stock ``dask scheduler`` process, the driver's dispatch pool
(:class:`pipelines.cluster.dispatch.RequestPool`) in this process under a renewed driver
lease, and the run store on the local disk and on S3 (moto's server on loopback, with S3's
atomic conditional writes). The workers are real Dask workers, many to a process
(:mod:`pipelines.bench.scale_hosts`), whose step is a fixed wait: the timing model this bench
injects, so hundreds fit on two cores.

Per size, the median over the iterations of: the iteration's wall time against its ideal, the
driver's and the scheduler's CPU seconds per request, the dispatch latency (the time a worker
waits between finishing a request and starting its next: the pool's decision, the scheduler's
hop and the worker's start), and the store operations by kind, per iteration and per second
per running request. Sizes are keyed by worker count as a string; ``sizes`` holds the local
disk's figures and ``s3`` → ``sizes`` the S3 server's, up to 64 workers: every step's latent
goes to the store, and past that the one moto process on two cores is what would be measured.
The JSON is saved after every size.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

import numpy as np
from distributed import Client

from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.bench.scale_hosts import process_operations, timed_request
from pipelines.bench.storage import cpu_s, moto_process, s3_environment
from pipelines.cluster import GPU, SPOT, ClusterHandle
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from spotlight.config import PreemptionConfig, shipped_config
from spotlight.sim.config import load_sim_config
from spotlight.sim.report import simulate
from storage import RunStore, StorageConfig, operations
from storage.manifest import stage_name


@dataclass(frozen=True)
class TimingModel:
    """What each worker does per iteration: ``requests`` of ``steps`` steps of ``step_s``."""

    requests: int = 4
    steps: int = 8
    step_s: float = 0.5

    @property
    def ideal_s(self) -> float:
        """The work per worker: every size's ideal iteration time."""
        return self.requests * self.steps * self.step_s


MODEL, QUICK_MODEL = TimingModel(), TimingModel(step_s=0.1)
SIZES, QUICK_SIZES = (8, 64, 256), (2, 4)
SIM_SCENARIO = "sim/qwen-image-512.yaml"
CALM_SHARE = 0.5   # a size whose machine was at most this busy measured the control plane
S3_LARGEST = 64   # the S3 server is one moto process: past this it, not the product, is measured
WORKERS_PER_PROCESS = 32
START_LIMIT_S = 300.0


@register_bench("scale")
def bench_scale(quick: bool = False, workers: list[int] | int | None = None,
                iterations: int | None = None, json_path: str | None = None,
                **_: object) -> dict:
    sizes = [workers] if isinstance(workers, int) else list(workers or
                                                            (QUICK_SIZES if quick else SIZES))
    if any(size < 2 or size % 2 for size in sizes):
        raise ValueError(f"bench scale: --workers {sizes}: each count must be even and at "
                         "least 2 (half gpu, half spot)")
    iterations = iterations or (1 if quick else 3)
    model = QUICK_MODEL if quick else MODEL
    started = time.monotonic()
    result = {"bench": "scale", "complete": False, "iterations": iterations,
              "model": {**asdict(model), "ideal_s": model.ideal_s,
                        "workers_per_process": WORKERS_PER_PROCESS, "s3_largest": S3_LARGEST},
              "machine": machine(), "sizes": {}, "s3": {"sizes": {}}}
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-scale-") as tmp, ExitStack() as up:
        up.enter_context(s3_environment())
        s3 = up.enter_context(moto_process(atomic=True))
        stores = {"file": lambda size: StorageConfig(url=f"file://{tmp}/file-{size}"),
                  "s3": lambda size: StorageConfig(
                      url=f"s3://spotlight-scale/{size}-{uuid.uuid4().hex[:8]}",
                      endpoint_url=s3.endpoint, key="bench-key", secret="bench-secret",
                      region="us-east-1", create_bucket=True)}
        for size in sizes:   # one cluster per size, measured on each store in turn
            with ScaleCluster(size, Path(tmp, f"cluster-{size}")) as cluster, \
                    Client(cluster.address) as client:
                for backend in [b for b in stores if b == "file" or size <= S3_LARGEST]:
                    print(f"bench scale: {size} workers, {backend} store ...", file=sys.stderr,
                          flush=True)
                    into = result["sizes"] if backend == "file" else result["s3"]["sizes"]
                    into[str(size)] = measure_size(
                        client, cluster, iterations, stores[backend](size), model,
                        server_pid=s3.proc.pid if backend == "s3" else None)
                    result["wall_s"] = time.monotonic() - started
                    write_result(result, json_path)   # what is done so far survives a cut-off
    result["simulator"] = simulator_effect(result["sizes"], quick)
    result.update(complete=True, wall_s=time.monotonic() - started,
                  checks={"file": scaling_checks(result["sizes"]),
                          "s3": scaling_checks(result["s3"]["sizes"])})
    return result


def simulator_effect(sizes: dict, quick: bool = False) -> dict:
    """The paper-scale scenario (Qwen-Image 512², 8 on-demand GPUs and spot on the AWS trace)
    simulated without a dispatch delay and with a measured p95 (``timing.dispatch_s``): what
    the control plane's measured cost changes there. The p95 is the largest size's that left
    the machine at most half busy: past that the emulated workers' own commits saturate the
    cores, and the delay measures the machine (workers queue for a core), not the dispatch."""
    calm = [n for n, figures in sizes.items() if figures["machine_cpu_share"] <= CALM_SHARE]
    largest = max(calm or sizes, key=int)
    dispatch_s = sizes[largest]["dispatch_latency_s"]["p95"]
    config = load_sim_config(shipped_config(SIM_SCENARIO))
    if quick:   # fewer iterations to the target: the same comparison, sooner
        config = config.with_values({"convergence.ondemand_iterations": 30,
                                     "max_iterations": 200})
    out: dict = {"scenario": SIM_SCENARIO, "dispatch_s": dispatch_s, "from_size": largest}
    for name, delay in (("without", 0.0), ("with", dispatch_s)):
        run = simulate(config.with_values({"timing.dispatch_s": delay}))
        out[name] = {"time_to_target_h": {k: v["time_to_target_h"]
                                          for k, v in run["systems"].items()},
                     "speedup_vs_ondemand": run["speedup_vs_ondemand"],
                     "cost_ratio_vs_ondemand": run["cost_ratio_vs_ondemand"]}
    return out


def scaling_checks(sizes: dict) -> dict:
    """The issue's targets, largest size against smallest: the iteration within 10% of its
    ideal, the driver's CPU per request at most 2x, store reads per running request no more."""
    if len(sizes) < 2:
        return {}
    counts = sorted(sizes, key=int)
    small, large = sizes[counts[0]], sizes[counts[-1]]
    return {"largest": counts[-1], "smallest": counts[0],
            "iteration_within_10pct": large["iteration_s"] <= 1.1 * large["ideal_s"],
            "driver_cpu_per_request_ratio": _ratio(large["driver_cpu_s_per_request"],
                                                   small["driver_cpu_s_per_request"]),
            "store_reads_per_s_per_request_ratio": _ratio(
                large["store_reads_per_s_per_request"], small["store_reads_per_s_per_request"])}


def _ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


# -- one size --------------------------------------------------------------------------------
def measure_size(client, cluster: "ScaleCluster", iterations: int, storage: StorageConfig,
                 model: TimingModel = MODEL, server_pid: int | None = None) -> dict:
    """``iterations`` pooled iterations on ``cluster`` against a fresh run store under a
    renewed lease; the median figures and each iteration's. ``server_pid``: the store's
    server process, whose CPU is counted too."""
    store = RunStore.open(storage, create=True, writer=True)
    lease = store.take_lease()
    lease.start_renewing()
    handle = ClusterHandle(client=client, owns_client=False, dashboard=False)
    try:
        runs = [run_iteration(handle, store, cluster, i, model, server_pid)
                for i in range(iterations)]
    finally:
        lease.release()
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    out = {k: median(run[k] for run in runs) for k in keys}
    out["dispatch_latency_s"] = {q: median(run["dispatch_latency_s"][q] for run in runs)
                                 for q in runs[0]["dispatch_latency_s"]}
    return {**out, "iterations": runs}


def run_iteration(handle: ClusterHandle, store: RunStore, cluster: "ScaleCluster",
                  iteration: int, model: TimingModel, server_pid: int | None = None) -> dict:
    stage = stage_name(iteration, "rollout")
    store.latents.prepare_stage(stage)
    size = cluster.size
    names = [f"r{j:05d}" for j in range(model.requests * size)]
    specs = [RequestSpec(name, timed_request, (store, stage, name, model.steps, model.step_s),
                         stage, name, numbered=True) for name in names]
    before = Usage.now(handle.client, cluster, server_pid)
    began, began_wall = time.monotonic(), time.time()
    pool = RequestPool(handle, specs, PreemptionConfig(), store=store, resource=(GPU, SPOT))
    pool.wait()
    results = pool.close()
    elapsed = time.monotonic() - began
    store.mark_stage_done(stage, {"requests": len(results)})
    used = Usage.now(handle.client, cluster, server_pid).since(before)
    if len(results) != len(specs):
        raise RuntimeError(f"bench scale: {len(specs) - len(results)} of {len(specs)} requests "
                           f"did not finish at {size} workers ({pool.summary()})")
    running = sum(r["ended"] - r["started"] for r in results.values()) / elapsed
    reads = operations.reads(used.store_driver) + operations.reads(used.store_workers)
    return {"iteration_s": elapsed, "ideal_s": model.ideal_s, "requests": len(specs),
            "running_requests": running,
            "driver_cpu_s": used.driver_cpu_s, "scheduler_cpu_s": used.scheduler_cpu_s,
            "workers_cpu_s": used.workers_cpu_s, "store_server_cpu_s": used.server_cpu_s,
            # Near 1: the machine was saturated, and the iteration's time measures it (the
            # workers' own commits, which a real cluster spreads over their machines).
            "machine_cpu_share": (used.driver_cpu_s + used.scheduler_cpu_s + used.workers_cpu_s
                                  + used.server_cpu_s) / (elapsed * (os.cpu_count() or 1)),
            "driver_cpu_s_per_request": used.driver_cpu_s / len(specs),
            "scheduler_cpu_s_per_request": used.scheduler_cpu_s / len(specs),
            "dispatch_latency_s": latency_quantiles(dispatch_latencies(results, began_wall)),
            "store_reads_per_s_per_request": reads / elapsed / running,
            "driver_reads_per_s_per_request": operations.reads(used.store_driver)
            / elapsed / running,
            "store_driver": used.store_driver, "store_workers": used.store_workers,
            "store_per_s": {k: n / elapsed for k, n in
                            (used.store_driver + used.store_workers).items()}}


def dispatch_latencies(results: dict[str, dict], began: float) -> list[float]:
    """Per request: how long its worker waited for it -- since the pool began for a worker's
    first request, since the worker's previous request ended for the others."""
    by_worker: dict[str, list[dict]] = {}
    for record in results.values():
        by_worker.setdefault(record["worker"], []).append(record)
    out = []
    for records in by_worker.values():
        records.sort(key=lambda r: r["started"])
        ends = [began] + [r["ended"] for r in records[:-1]]
        out += [max(0.0, r["started"] - end) for r, end in zip(records, ends)]
    return out


def latency_quantiles(latencies: list[float]) -> dict:
    values = np.asarray(latencies or [0.0])
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
            "max": float(values.max())}


# -- what was used ---------------------------------------------------------------------------
@dataclass
class Usage:
    """CPU seconds of the driver (this process), the scheduler, the worker processes and the
    store's server (0 without one); store operations of the driver and of the workers, by
    kind."""

    driver_cpu_s: float
    scheduler_cpu_s: float
    workers_cpu_s: float
    server_cpu_s: float = 0.0
    store_driver: Counter = field(default_factory=Counter)
    store_workers: Counter = field(default_factory=Counter)

    @classmethod
    def now(cls, client, cluster: "ScaleCluster", server_pid: int | None = None) -> "Usage":
        per_process = dict(client.run(process_operations).values())   # workers share a pid
        return cls(time.process_time(), cpu_s(cluster.scheduler.pid),
                   sum(cpu_s(host.pid) for host in cluster.hosts),
                   0.0 if server_pid is None else cpu_s(server_pid),
                   Counter(operations.operations()),
                   sum(map(Counter, per_process.values()), Counter()))

    def since(self, before: "Usage") -> "Usage":
        return Usage(self.driver_cpu_s - before.driver_cpu_s,
                     self.scheduler_cpu_s - before.scheduler_cpu_s,
                     self.workers_cpu_s - before.workers_cpu_s,
                     self.server_cpu_s - before.server_cpu_s,
                     self.store_driver - before.store_driver,   # counts only grow
                     self.store_workers - before.store_workers)


# -- the cluster -----------------------------------------------------------------------------
class ScaleCluster:
    """A ``dask scheduler`` on loopback and ``size`` workers, ``WORKERS_PER_PROCESS`` to a
    process, half of each process gpu and half spot; their output goes to ``workdir``."""

    def __init__(self, size: int, workdir: Path) -> None:
        self.size, self.workdir = size, workdir
        self.scheduler: subprocess.Popen | None = None
        self.hosts: list[subprocess.Popen] = []
        self.address = ""

    def __enter__(self) -> "ScaleCluster":
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        scheduler_file = self.workdir / "scheduler.json"
        self.scheduler = self._popen("scheduler", "-m", "distributed.cli.dask_scheduler",
                                     "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                     "--scheduler-file", str(scheduler_file))
        deadline = time.monotonic() + START_LIMIT_S
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            self._check_alive(self.scheduler, "the scheduler", deadline)
            time.sleep(0.1)
        self.address = json.loads(scheduler_file.read_text())["address"]
        for i, first in enumerate(range(0, self.size, WORKERS_PER_PROCESS)):
            count = min(WORKERS_PER_PROCESS, self.size - first)
            self.hosts.append(self._popen(
                f"host-{i}", "-m", "pipelines.bench.scale_hosts", self.address,
                "--gpu", str(count // 2), "--spot", str(count - count // 2),
                "--prefix", f"h{i:02d}", "--dir", str(self.workdir / f"host-{i}"),
                stdout=subprocess.PIPE))
        for host in self.hosts:
            while host.stdout.readline().strip() != "ready":
                self._check_alive(host, "a worker process", deadline)

    def _popen(self, name: str, *args: str, stdout=None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")   # noqa: SIM115 - the child holds it
        return subprocess.Popen([sys.executable, *args], stdout=stdout or log, stderr=log,
                                text=True, start_new_session=True)

    def _check_alive(self, proc: subprocess.Popen, what: str, deadline: float) -> None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"bench scale: {what} did not start with {self.size} workers "
                               f"(exit {proc.poll()}); its log is in {self.workdir}")

    def __exit__(self, *_: object) -> None:
        for proc in [*self.hosts, self.scheduler]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.hosts, self.scheduler]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
