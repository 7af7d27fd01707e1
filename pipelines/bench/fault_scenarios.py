"""The scenarios of ``spotlight bench faults`` (:mod:`pipelines.bench.faults`), each a fault
injected into a run on the test bed, measured against the clean run.

Every time is wall-clock (``time.time()``), one clock for every host of the bed: they share the
kernel. A scenario returns ``requests_lost``, ``identical_to_clean``, ``foreign_writes``,
``detect_s``, ``recover_s`` and what it saw besides.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from pipelines.bench.bed_cluster import BedCluster
from pipelines.bench.fault_checks import (
    Timeline,
    foreign_lineage_steps,
    given_up_attempts,
    lease_taken_at,
    requests_lost,
    run_differences,
    stage_records_after,
)
from pipelines.bench.fault_stream import STAGE, expected
from pipelines.bench.preemption import dispatch_logs
from pipelines.bench.testbed import Testbed, kill, session_pids
from storage import RunStore

RUN_LIMIT_S = 1800.0


@dataclass
class Driver:
    """A ``spotlight`` process on a test-bed host, its output read line by line as it comes."""

    proc: subprocess.Popen
    out: Timeline
    err: Timeline

    @classmethod
    def start(cls, cluster: BedCluster, *args: str, host: str = "driver") -> "Driver":
        proc = cluster.spotlight(*args, host=host)
        return cls(proc, _pumped(proc.stdout), _pumped(proc.stderr))

    def wait(self, timeout: float = RUN_LIMIT_S) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the driver ran past {timeout:.0f} s:\n{self.text()}") from None
        time.sleep(0.3)   # the pumps read what is left
        return code

    def kill(self) -> None:
        kill(self.proc)

    def text(self) -> str:
        return self.out.text() + "\n" + self.err.text()


def _pumped(stream) -> Timeline:
    into = Timeline()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            into.add(line)

    threading.Thread(target=pump, daemon=True).start()
    return into


@dataclass
class Bench:
    """What every scenario shares: the bed, its cluster, the run's config and the clean run."""

    bed: Testbed
    cluster: BedCluster
    config_path: Path
    iterations: int
    root: Path
    clean_url: str | None = None
    driver_options: tuple[str, ...] = ()   # more ``spotlight run`` options for every run

    def run_args(self, url: str, *extra: str) -> list[str]:
        return ["run", "--config", str(self.config_path), "--iterations", str(self.iterations),
                "--scheduler", self.cluster.scheduler, "--store", url, *self.driver_options,
                *extra]

    def store(self, url: str, create: bool = False):
        """The run store at ``url``, read from this process (the root namespace)."""
        return RunStore.open(self.cluster.store_config(url, create_bucket=create), create=create)

    def stage_done(self, url: str, stage: str) -> bool:
        try:
            return self.store(url).is_stage_done(stage)
        except Exception:   # noqa: BLE001 - the run is not created yet
            return False

    def outcome(self, url: str, since: float) -> dict:
        """The figures every scenario reports, from its store and the clean one's."""
        store, clean = self.store(url), self.store(self.clean_url)
        epochs = [r.get("epoch", 0) for r in store.manifest.stages().values()]
        differences = run_differences(clean, store, self.iterations)
        return {"requests_lost": requests_lost(clean, store, self.iterations),
                "identical_to_clean": not differences,
                "foreign_writes": len(stage_records_after(store, max(epochs, default=0), since)),
                **({"differences": differences} if differences else {})}


def wait_until(check: Callable[[], bool], limit_s: float, driver: Driver | None = None,
               what: str = "") -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if driver is not None and driver.proc.poll() is not None:
            raise RuntimeError(f"the driver exited ({driver.proc.returncode}) before {what}:\n"
                               f"{driver.text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {limit_s:.0f} s")
        time.sleep(0.2)


def _finished(driver: Driver, what: str) -> None:
    code = driver.wait()
    if code != 0:
        raise RuntimeError(f"{what} failed (exit {code}):\n{driver.text()}")


def run_clean(bench: Bench) -> Driver:
    """The run every scenario is compared with, run to its end; ``bench.clean_url`` names it."""
    url = bench.cluster.store_url("clean")
    driver = Driver.start(bench.cluster, *bench.run_args(url))
    _finished(driver, "the clean run")
    bench.clean_url = url
    return driver


def clean_run(bench: Bench) -> dict:
    start = time.time()
    run_clean(bench)
    return {"url": bench.clean_url, "wall_s": time.time() - start}


def partition(bench: Bench, host: str = "spot-1", heal_after_s: float = 45.0) -> dict:
    """``detect_s``: the link down -> the pool's first notice of the cut-off worker in the run's
    event log: ``silent`` (no committed step within the silence limit) or ``worker_lost``
    (Dask dropped the connection), whichever comes first; on a loaded machine either can.
    ``recover_s``: that notice -> the last moved request finished elsewhere. After the heal
    the cut-off worker's late writes must stay out of every stored trajectory."""
    url = bench.cluster.store_url("partition")
    driver = Driver.start(bench.cluster, *bench.run_args(url))
    # Iteration 1's exploration runs on spot while iteration 0 trains: cut a spot host then.
    wait_until(lambda: _listed(bench, url, "iter-000001", "explore.commits"), 900, driver,
               "iteration 1's exploration")
    cut = time.time()
    bench.bed.partition(host)
    healed: list[float] = []

    def heal_now() -> None:
        if not healed:
            healed.append(time.time())
            bench.bed.heal(host)

    heal = threading.Timer(heal_after_s, heal_now)
    heal.start()
    _finished(driver, "the partitioned run")
    heal.cancel()
    heal_now()
    time.sleep(10.0)   # the healed worker's attempt writes on, and is fenced
    store = bench.store(url)
    requests = [e for e in store.read_events() if e.get("kind") == "request"
                and e.get("worker") == host]
    notices = sorted((e for e in requests if e.get("what") in ("silent", "worker_lost")),
                     key=lambda e: e["at"])
    given_up = given_up_attempts(dispatch_logs(store, bench.iterations), epoch=1)
    ends = [store.latents.commit_record(g.stage, g.request).get("updated_at", 0.0)
            for g in given_up]
    detected = notices[0]["at"] if notices else None
    out = bench.outcome(url, cut)
    out["foreign_writes"] += foreign_lineage_steps(store, given_up)
    return {**out, "detect_s": None if detected is None else detected - cut,
            "recover_s": None if detected is None or not ends else max(ends) - detected,
            "detected_by": notices[0]["what"] if notices else None,
            "moved_requests": len(given_up), "host": host, "healed_after_s": heal_after_s,
            # the pool's own account: requests it took back from the host, and any it gave
            # the host between noticing it gone and the heal (there must be none)
            "requeued": sum(e.get("what") == "requeued" for e in requests),
            "assigned_while_cut": sum(e.get("what") == "assigned" and detected is not None
                                      and detected < e["at"] < healed[0] for e in requests)}


def _listed(bench: Bench, url: str, *parts: str) -> bool:
    try:
        return bool(bench.store(url).location.list_names(*parts))
    except Exception:   # noqa: BLE001 - not there yet
        return False


def zombie(bench: Bench, steps: int = 12) -> dict:
    """Attempt 1 (spot-0, kernel 1) streams a request; at step 4 its host is cut off and
    attempt 2 (spot-1, kernel 2) takes the request over and finishes it; then spot-0 comes
    back and attempt 1 writes on. ``detect_s``: the heal -> attempt 1 stopped as fenced.
    ``recover_s``: the cut -> the request finished. ``foreign_writes``: stored steps equal to
    attempt 1's values after the takeover."""
    url = bench.cluster.store_url("zombie")
    bench.store(url, create=True)
    first = _stream(bench, "spot-0", url, number=1, kernel=1, steps=steps, step_s=0.4)
    wait_until(lambda: first.first("step 4") is not None, 300, what="attempt 1's step 4")
    cut = time.time()
    bench.bed.partition("spot-0")
    second = _stream(bench, "spot-1", url, number=2, kernel=2, steps=steps, step_s=0.05)
    wait_until(lambda: second.first("done") is not None or second.first("fenced") is not None,
               300, what="attempt 2's end")
    healed = time.time()
    bench.bed.heal("spot-0")
    wait_until(lambda: first.first("fenced") is not None or first.first("done") is not None,
               300, what="attempt 1's end")
    store = bench.store(url)
    record = store.latents.commit_record(STAGE, "r")
    took_at = int(second.lines[0][1].split()[1])   # "claimed K": it resumed after step K
    traj = store.read_trajectory(STAGE, "r")
    winner = expected([(0, 1), (took_at + 1, 2)], steps)
    stale = expected([(0, 1)], steps)
    foreign = sum(1 for t in range(took_at + 1, len(traj)) if np.array_equal(traj[t], stale[t]))
    fenced_at = first.first("fenced")
    return {"requests_lost": 0 if record["step"] == steps else 1,
            "identical_to_clean": bool(traj.shape == winner.shape
                                       and np.array_equal(traj, winner)),
            "foreign_writes": foreign,
            "detect_s": None if fenced_at is None else fenced_at - healed,
            "recover_s": (second.first("done") or healed) - cut,
            "takeover_step": took_at, "lineage": record.get("lineage"),
            # what the stale attempt wrote after the takeover: in the store, not in the run
            "stale_steps_stored": [t for t in store.latents.written_steps(
                STAGE, "r") if t > took_at],
            "stale_attempt": first.lines[-1][1][:200]}


def _stream(bench: Bench, host: str, url: str, **options) -> Timeline:
    argv = [sys.executable, "-m", "pipelines.bench.fault_stream", url, "r"]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    proc = bench.bed.host(host).popen(argv, env=bench.cluster.env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
    return _pumped(proc.stdout)


def dual_driver(bench: Bench) -> dict:
    """A second driver on another host: a plain ``--resume`` is refused (``refuse_s``), then
    ``--takeover --force`` fences the first. ``detect_s``: the takeover -> the first driver's
    ``error: fenced:`` line. ``recover_s``: the takeover -> the new driver's first stage."""
    url = bench.cluster.store_url("dual")
    first = Driver.start(bench.cluster, *bench.run_args(url)[:4], "40",
                         *bench.run_args(url)[5:])   # runs on until it is fenced
    wait_until(lambda: bench.stage_done(url, "iter-0/iteration"), 900, first, "iteration 0")
    asked = time.time()
    second = Driver.start(bench.cluster, "run", "--resume", url, host="driver-2")
    refused = second.wait(300)
    refuse_s = time.time() - asked
    first_undisturbed = first.proc.poll() is None
    taker = Driver.start(bench.cluster, "run", "--resume", url, "--takeover", "--force",
                         "--iterations", str(bench.iterations), host="driver-2")
    _finished(taker, "the taking-over driver")
    first_code = first.wait(600)
    store = bench.store(url)
    took = lease_taken_at(store, 2) or taker.err.first("lease: epoch") or asked
    fenced = first.err.first("error: fenced:")
    mine = [r["at"] for r in store.manifest.stages().values() if r.get("epoch", 0) >= 2]
    out = bench.outcome(url, took)
    return {**out, "detect_s": None if fenced is None else fenced - took,
            "recover_s": None if not mine else min(mine) - took,
            "refused_exit": refused, "refuse_s": refuse_s, "first_exit": first_code,
            "first_pid": first.proc.pid, "first_undisturbed": first_undisturbed,
            "refused": _errors(second), "refused_started": "run:" in second.out.text(),
            "taker_lease": _lines(taker.err, "lease: epoch"), "first_errors": _errors(first),
            "tracebacks": _tracebacks(first, second, taker)}


def _lines(timeline: Timeline, text: str) -> list[str]:
    return [line[:300] for _, line in timeline.lines if text in line]


def _tracebacks(*drivers: Driver) -> int:
    """How many of ``drivers`` printed a traceback (a user reads one line, not a stack)."""
    return sum("Traceback" in driver.err.text() for driver in drivers)


def _errors(driver: Driver) -> list[str]:
    """The ``error:`` lines a driver printed: what its user reads."""
    return [line[:300] for _, line in driver.err.lines if line.startswith("error:")]


def store_outage(bench: Bench, outage_s: float = 30.0) -> dict:
    """The S3 host's link is down for ``outage_s`` after iteration 0. ``detect_s``: the cut ->
    the driver's first storage warning. ``recover_s``: the link back -> the next stage
    recorded."""
    url = bench.cluster.store_url("outage")
    driver = Driver.start(bench.cluster, *bench.run_args(url))
    wait_until(lambda: bench.stage_done(url, "iter-0/iteration"), 900, driver, "iteration 0")
    cut = time.time()
    bench.bed.partition("store")
    time.sleep(outage_s)
    bench.bed.heal("store")
    healed = time.time()
    _finished(driver, "the run through a store outage")
    noticed = driver.err.first("storage:", after=cut)
    later = [r["at"] for r in bench.store(url).manifest.stages().values()
             if r.get("at", 0.0) > healed]
    return {**bench.outcome(url, cut), "detect_s": None if noticed is None else noticed - cut,
            "recover_s": None if not later else min(later) - healed, "outage_s": outage_s}


def driver_loss(bench: Bench) -> dict:
    """The driver is SIGKILLed after iteration 0 and a driver on another host is started at
    once with ``--takeover``: it waits the unrenewed lease out and takes the run over.
    ``detect_s``: the kill -> the new driver holds the lease. ``recover_s``: the kill -> the
    new driver's first stage recorded."""
    url = bench.cluster.store_url("driver-loss")
    driver = Driver.start(bench.cluster, *bench.run_args(url))
    wait_until(lambda: bench.stage_done(url, "iter-0/iteration"), 900, driver, "iteration 0")
    killed = time.time()
    driver.kill()
    lease = json.loads(bench.store(url).location.read_bytes("lease.json", small=True))
    taker = Driver.start(bench.cluster, "run", "--resume", url, "--takeover", "--iterations",
                         str(bench.iterations), host="driver-2")
    _finished(taker, "the taking-over driver")
    waited = taker.err.first("lease: held by")   # the taker found it live, and waited it out
    took = lease_taken_at(bench.store(url), 2) or taker.err.first("lease: epoch")
    mine = [r["at"] for r in bench.store(url).manifest.stages().values()
            if r.get("epoch", 0) >= 2]
    return {**bench.outcome(url, killed), "detect_s": None if took is None else took - killed,
            "recover_s": None if not mine else min(mine) - killed,
            "lease_ttl_s": lease["expires_at"] - lease["renewed_at"],
            "takeover_waited_s": None if waited is None or took is None else took - waited}


def scheduler_loss(bench: Bench) -> dict:
    """The scheduler is killed after iteration 0. ``detect_s``: the kill -> the driver stops
    with its error. A new scheduler starts on another host, the workers join it, and
    ``spotlight run --resume URL --scheduler NEW`` finishes the run; ``recover_s``: the kill
    -> the resumed run's first stage recorded."""
    url = bench.cluster.store_url("scheduler-loss")
    driver = Driver.start(bench.cluster, *bench.run_args(url))
    wait_until(lambda: bench.stage_done(url, "iter-0/iteration"), 900, driver, "iteration 0")
    killed = time.time()
    bench.cluster.stop_scheduler()
    code = driver.wait(900)
    stopped = time.time()
    bench.cluster.restart_scheduler("scheduler-2")
    resumed = Driver.start(bench.cluster, "run", "--resume", url, "--scheduler",
                           bench.cluster.scheduler, "--takeover")
    _finished(resumed, "the resumed run")
    later = [r["at"] for r in bench.store(url).manifest.stages().values()
             if r.get("at", 0.0) > stopped]
    error = _errors(driver)
    return {**bench.outcome(url, killed), "detect_s": stopped - killed,
            "recover_s": None if not later else min(later) - killed, "driver_exit": code,
            "driver_error": error[-1] if error else None,
            "tracebacks": _tracebacks(driver, resumed)}


def cpu_hog(bench: Bench, host: str = "spot-1", hogs: int = 2) -> dict:
    """A slow but healthy worker: ``host``'s worker shares one core with ``hogs`` busy
    processes for the whole run, so its heartbeats and steps come late but never stop.
    ``false_cut_offs``: the workers the run cut off for silence (none should be);
    ``slowdown``: the run's wall time over the clean run's. No ``detect_s``: nothing is to be
    detected."""
    url = bench.cluster.store_url("cpu-hog")
    worker = bench.cluster._worker_procs[host]
    pinned = session_pids(worker.pid)   # the nanny and its worker
    everywhere = os.sched_getaffinity(0)
    core = {min(everywhere)}
    busy = [bench.bed.host(host).popen([sys.executable, "-c", "while True: pass"])
            for _ in range(hogs)]
    start = time.time()
    try:
        for pid in pinned + [p.pid for p in busy]:
            os.sched_setaffinity(pid, core)
        driver = Driver.start(bench.cluster, *bench.run_args(url))
        _finished(driver, "the run beside the CPU hog")
    finally:
        for proc in busy:
            kill(proc)
        for pid in pinned:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, everywhere)
    wall = time.time() - start
    cut = [e.get("worker") for e in bench.store(url).read_events()
           if e.get("kind") == "dispatch" and e.get("what") == "silent"]
    clean = bench.store(bench.clean_url).manifest.stages()
    clean_s = max(r["at"] for r in clean.values()) - min(r["at"] for r in clean.values())
    return {**bench.outcome(url, start), "false_cut_offs": len(cut), "cut_off": cut,
            "wall_s": wall, "slowdown": wall / max(clean_s, 1e-9), "detect_s": None,
            "pinned_to_core": sorted(core), "hogs": hogs}


SCENARIOS = {"partition": partition, "zombie": zombie, "dual_driver": dual_driver,
             "store_outage": store_outage, "driver_loss": driver_loss, "cpu_hog": cpu_hog,
             "scheduler_loss": scheduler_loss}
