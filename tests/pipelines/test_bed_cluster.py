"""A run across hosts, as on VMs: scheduler, S3 store, gpu and spot workers and the driver each
on its own network namespace, all over TLS; the run's state lands on the S3 host."""
from __future__ import annotations

import pytest

from pipelines.bench.bed_cluster import start_bed_cluster

pytestmark = pytest.mark.timeout(900)


def test_an_iteration_runs_across_hosts_over_tls_with_its_store_on_s3(testbed, tiny_run_yaml,
                                                                      tmp_path, monkeypatch):
    cluster = start_bed_cluster(testbed, tmp_path / "bed")
    url = cluster.store_url("run-1")
    proc = cluster.spotlight("run", "--config", str(tiny_run_yaml), "--iterations", "1",
                             "--scheduler", cluster.scheduler, "--store", url)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    assert f"run: {url}" in out and "done: 1 iterations" in out

    for key, value in cluster.store_env().items():   # read the store as an auditor would
        monkeypatch.setenv(key, value)
    from storage import RunStore

    store = RunStore.open(url, create=False)
    assert store.is_stage_done("iter-0/iteration") and store.latest_checkpoint() == 1
    workers = {r["worker"] for r in store.get_json("iter-0/iteration", "tasks")["tasks"]}
    assert workers <= {"gpu-0", "spot-0"} and "gpu-0" in workers


def test_a_cut_off_spot_host_is_noticed_from_silence_and_its_requests_move(
        testbed, tiny_run_yaml, tmp_path, monkeypatch):
    """spot-1's link goes down while exploration runs: Dask still lists it (its TTL is
    minutes), its request commits no more steps, and the pool moves that request to spot-0.
    Usually the pool notices from the silence; on a loaded machine Dask's own loss of the
    connection can come first (one CI run of 3), and either way the request must move."""
    import time

    cluster = start_bed_cluster(testbed, tmp_path / "bed", spot=2)
    for key, value in cluster.store_env().items():   # this process reads the store as an auditor
        monkeypatch.setenv(key, value)
    from storage import RunStore

    url = cluster.store_url("run-cut")
    # Two iterations (the first explores on spot for the second); requests of 60 steps, so
    # that one is under way on spot-1 when its link goes down.
    proc = cluster.spotlight("run", "--config", str(tiny_run_yaml), "--iterations", "2",
                             "--scheduler", cluster.scheduler, "--store", url,
                             "--set", "sampler.num_steps=60", "--set", "exploration.candidates=24",
                             "--set", "preemption.liveness_first_s=10",
                             "--set", "preemption.liveness_floor_s=5")
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            store = RunStore.open(url, create=False)
            if store.location.list_names("iter-000001", "explore.commits"):   # for iteration 1
                break
        except Exception:   # noqa: BLE001 - not created yet
            pass
        time.sleep(0.2)
    testbed.partition("spot-1")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err

    store = RunStore.open(url, create=False)
    assert store.is_stage_done("iter-1/iteration")
    moves = [e for e in store.read_events() if e["kind"] == "request"]
    story = [(e["stage"], e["what"], e.get("worker"), e.get("request")) for e in moves]
    gone = [e for e in moves if e["what"] in ("silent", "worker_lost") and e["worker"] == "spot-1"]
    assert gone, story
    moved = {e["request"] for e in moves if e["what"] == "requeued" and e["worker"] == "spot-1"}
    assert moved, story
    after = [e for e in moves if e["at"] > gone[0]["at"] and e["what"] == "assigned"]
    assert all(e["worker"] != "spot-1" for e in after), story
