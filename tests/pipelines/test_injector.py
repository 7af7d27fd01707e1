"""The preemption injector's decisions, acting on real processes: which spot workers a drop
hits, kill or notice, starts on a rise -- against a stand-in cluster whose "workers" are real
`sleep` processes, so every SIGKILL and SIGTERM is real and checked."""
from __future__ import annotations

import signal
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pipelines.cluster import ClusterError, ClusterHandle
from pipelines.cluster.injector import PreemptionInjector, SpotFleet, injection_trace
from spotlight.config import ClusterConfig, InjectorConfig
from spotlight.scheduling.traces import choose_victims


class StandInCluster:
    """What SpotFleet uses of a SpecCluster: the spec, the nannies (pid, status), sync."""

    def __init__(self, spot: int) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.worker_spec: dict = {"gpu-0": {"options": {"resources": {"gpu": 1}}}}
        self.workers: dict = {}
        self.corrections = 0
        for i in range(spot):
            self._start(f"spot-{i}")

    def _start(self, name: str) -> None:
        proc = subprocess.Popen(["sleep", "120"])
        self.procs[name] = proc
        self.worker_spec.setdefault(name, {"options": {"resources": {"spot": 1}}})
        self.workers[name] = SimpleNamespace(pid=proc.pid, status=SimpleNamespace(name="running"),
                                             close_gracefully=lambda: None)

    def _correct_state(self):
        self.corrections += 1
        for name in self.worker_spec:
            if name not in self.workers:
                self._start(name)

    def sync(self, fn):
        return fn()

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


@pytest.fixture
def cluster():
    stand_in = StandInCluster(spot=3)
    yield stand_in
    stand_in.close()


def _handle(cluster) -> ClusterHandle:
    return ClusterHandle(client=None, cluster=cluster, owns_client=False)


def _died_of(proc: subprocess.Popen, sig: int) -> bool:
    try:
        return proc.wait(timeout=5) == -sig
    except subprocess.TimeoutExpired:
        return False


def test_a_remote_cluster_cannot_be_injected():
    with pytest.raises(ClusterError, match="needs the embedded cluster"):
        SpotFleet(ClusterHandle(client=None, cluster=None), ClusterConfig())


def test_injection_trace_scales_to_the_cap_or_is_poisson_or_nothing(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n0,add,c\n0,add,d\n60000,remove,a\n120000,add,e\n")
    scaled = injection_trace(InjectorConfig(trace=str(trace)), cap=2)
    assert max(count for _, count in scaled.counts) <= 2
    assert injection_trace(InjectorConfig(), cap=2) is None
    poisson = injection_trace(InjectorConfig(poisson_rate_per_hour=30.0), cap=2)
    assert poisson is not None and len(poisson.counts) > 10


def test_a_drop_kills_seeded_victims_and_mixed_alternates_kill_and_notice(cluster, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n0,add,c\n1000,remove,a\n1000,remove,b\n")
    config = InjectorConfig(trace=str(trace), action="mixed", seed=3)
    injector = PreemptionInjector(_handle(cluster), config, ClusterConfig(spot_workers=3))
    assert injector.start_count == 3 and [e.change for e in injector.schedule] == [-2]
    injector._apply(-2, trace_s=1.0)
    hits = [(r["kind"], r["worker"]) for r in injector.log]
    assert [kind for kind, _ in hits] == ["kill", "notice"]   # mixed: kill first, then notice
    killed, noticed = hits[0][1], hits[1][1]
    assert _died_of(cluster.procs[killed], signal.SIGKILL)
    assert _died_of(cluster.procs[noticed], signal.SIGTERM)
    assert killed not in cluster.worker_spec                  # gone for good, like a lost VM
    assert noticed in cluster.worker_spec                     # retires itself after its hand-back
    assert injector.fleet.names() == sorted(set(cluster.workers) - {killed, noticed, "gpu-0"})
    # The victims come from the seed: the same draw picks the same names again.
    assert choose_victims(["spot-0", "spot-1", "spot-2"], 2,
                          np.random.default_rng(config.seed)) == [killed, noticed]


def test_dropping_every_worker_says_so_and_a_rise_starts_new_ones(cluster):
    injector = PreemptionInjector(_handle(cluster), InjectorConfig(poisson_rate_per_hour=1.0),
                                  ClusterConfig(spot_workers=3))
    injector._apply(-3, trace_s=5.0)
    assert [r["kind"] for r in injector.log][0] == "no_spot_left"
    assert all(_died_of(cluster.procs[n], signal.SIGKILL) for n in ("spot-0", "spot-1", "spot-2"))
    started = injector.fleet.add(2)
    assert started == ["spot-3", "spot-4"] and cluster.corrections == 1
    assert all(cluster.procs[n].poll() is None for n in started)   # real, running processes
    assert [r["worker"] for r in injector.log if r["kind"] == "start"] == started


def test_the_replay_thread_stops_when_asked(cluster, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n0,add,c\n3600000,remove,a\n")
    injector = PreemptionInjector(_handle(cluster), InjectorConfig(trace=str(trace)),
                                  ClusterConfig(spot_workers=3)).start()
    time.sleep(0.3)
    started = time.monotonic()
    injector.stop()
    assert time.monotonic() - started < 5 and not injector._thread.is_alive()
    assert injector.summary()["kills"] == 0   # the drop an hour away never happened


def test_a_run_that_outlives_the_trace_gets_it_replayed_from_the_start(cluster, tmp_path):
    # The trace ends with every node gone; 500 trace seconds last 1 s of wall time.
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n0,add,c\n500,remove,a\n500,remove,b\n500,remove,c\n")
    injector = PreemptionInjector(_handle(cluster),
                                  InjectorConfig(trace=str(trace), time_scale=0.002),
                                  ClusterConfig(spot_workers=3)).start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(r["kind"] == "start"
                                                      for r in injector.log):
            time.sleep(0.05)
    finally:
        injector.stop()
    kinds = [r["kind"] for r in injector.log]
    assert "no_spot_left" in kinds and "trace_restart" in kinds
    # The second replay begins as the first did: with the start's three spot workers.
    assert kinds.index("trace_restart") < kinds.index("start")
    assert kinds.count("start") >= 3
