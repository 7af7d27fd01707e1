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

import pytest
from distributed import Client, LocalCluster, wait

from pipelines.cluster.connect import LOOPBACK, ClusterHandle, ClusterLostError

pytestmark = pytest.mark.timeout(120)


def test_a_result_lost_with_the_last_worker_of_its_class_stops_the_fetch(tmp_path):
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", host=LOOPBACK,
                      dashboard_address=None) \
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
                      dashboard_address=None, resources={"gpu": 1}) as cluster, \
            Client(cluster) as client:
        futures = [client.submit(operator.mul, k, k, resources={"gpu": 1}) for k in range(4)]
        handle = ClusterHandle(client, owns_client=False)
        assert handle.results(futures, "gpu", threading.Event(), 5.0, "squares") == [0, 1, 4, 9]
