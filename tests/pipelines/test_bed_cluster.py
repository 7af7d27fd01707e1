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

    for key, value in cluster.env().items():   # read the store as an auditor would
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    from storage import RunStore

    store = RunStore.open(url, create=False)
    assert store.is_stage_done("iter-0/iteration") and store.latest_checkpoint() == 1
    workers = {r["worker"] for r in store.get_json("iter-0/iteration", "tasks")["tasks"]}
    assert workers <= {"gpu-0", "spot-0"} and "gpu-0" in workers
