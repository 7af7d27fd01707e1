"""A task's result lost with its worker after the task finished, before the driver fetched it.

Dask then computes the task again (its future goes back to pending); when the lost worker was
the last of its class, nothing can, and a plain fetch waited for ever: a stock cluster's run
whose every worker was killed while it fetched a validation result hung with no word. The
driver's fetch stops instead, in the one line a stage waiting for a class with no worker left
gives.
"""
from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from distributed import Client, LocalCluster, wait

from pipelines.cluster.classes import Silent
from pipelines.cluster.connect import LOOPBACK, ClusterHandle, ClusterLostError
from spotlight.scheduling.liveness import SilenceReports
from tests.ports import LOOPBACK_HTTP

pytestmark = pytest.mark.timeout(120)


def test_a_result_lost_with_the_last_worker_of_its_class_stops_the_fetch(tmp_path):
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", host=LOOPBACK,
                      **LOOPBACK_HTTP) \
            as cluster, Client(cluster) as client:
        worker = subprocess.Popen(   # no nanny: a killed worker stays gone, as a lost VM does
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--no-nanny", "--nthreads", "1", "--resources", "gpu=1", "--no-dashboard"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dies = threading.Timer(1.0, worker.kill)
        try:
            client.wait_for_workers(1, timeout=60)
            future = client.submit(operator.add, 41, 1, resources={"gpu": 1}, pure=False)
            wait([future])
            # Frozen with the result in its memory: the scheduler still lists it, the future
            # stays finished, and the fetch starts; then the worker dies under the fetch.
            os.kill(worker.pid, signal.SIGSTOP)
            dies.start()
            handle = ClusterHandle(client, owns_client=False)
            with pytest.raises(ClusterLostError, match="no worker with resource 'gpu' left"):
                handle.results([future], "gpu", threading.Event(), 1.0, "the validation")
        finally:
            dies.cancel()
            worker.kill()
            worker.wait()


def test_finished_results_are_fetched_in_one_batch():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                      host=LOOPBACK,
                      **LOOPBACK_HTTP, resources={"gpu": 1}) as cluster, \
            Client(cluster) as client:
        futures = [client.submit(operator.mul, k, k, resources={"gpu": 1}) for k in range(4)]
        handle = ClusterHandle(client, owns_client=False)
        assert handle.results(futures, "gpu", threading.Event(), 5.0, "squares") == [0, 1, 4, 9]


def test_a_gpu_worker_silent_under_a_single_task_is_named_and_the_task_finishes_there(tmp_path):
    """A training task's worker stops answering (SIGSTOP: as behind a partition): the wait
    names it once, after the heartbeat limit, and when it comes back the task finishes where
    it ran -- nothing is moved or computed twice."""
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", host=LOOPBACK,
                      **LOOPBACK_HTTP) \
            as cluster, Client(cluster) as client:
        worker, spot = (subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--no-nanny", "--nthreads", "1", "--resources", f"{cls}=1", "--no-dashboard",
             "--name", f"{cls}-0"], cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL) for cls in ("gpu", "spot"))
        told: list[tuple[str, str]] = []
        heard = threading.Event()

        def tell(name: str, quiet: float, what: str) -> None:
            assert quiet > 2.0
            told.append((name, what))
            os.kill(worker.pid, signal.SIGCONT)   # the partition heals once it was named
            heard.set()

        try:
            # Silence is counted against the freshest heartbeat (no clock skew): the spot
            # worker's, as in a run.
            client.wait_for_workers(2, timeout=60)
            future = client.submit(time.sleep, 3.0, resources={"gpu": 1}, pure=False)
            os.kill(worker.pid, signal.SIGSTOP)
            handle = ClusterHandle(client, owns_client=False)
            handle.wait_for([future], "gpu", threading.Event(), 120.0, "the training",
                            Silent(SilenceReports(limit_s=2.0), tell))
            assert heard.is_set() and told == [("gpu-0", "the training")]
            assert future.status == "finished"
            assert worker.pid in client.run(os.getpid).values()   # never dropped
        finally:
            os.kill(worker.pid, signal.SIGCONT)
            for proc in (worker, spot):
                proc.kill()
                proc.wait()
