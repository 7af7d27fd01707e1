"""A worker process per device on a multi-GPU node: each claims a device of its own, whichever
way the node started them, and a restarted one takes the device its predecessor left. The
node's device count is set (``cluster.devices_per_node``) where this CPU machine has none."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from pipelines.bench.testbed import kill as kill_tree
from pipelines.cluster import register_worker_setup, start_embedded
from pipelines.cluster.devices import claim_device_slot, held_device_slot, lock_folder
from pipelines.parallel.groups import live_workers
from spotlight.config import ClusterConfig
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)


def _claim_and_hold(count: int, folder: str, claimed) -> None:
    from pathlib import Path

    slot = claim_device_slot(count, Path(folder))
    claimed.put((os.getpid(), None if slot is None else slot.index))
    time.sleep(120)   # holds it until the test kills it


def test_processes_of_one_node_claim_distinct_devices_until_one_dies(tmp_path):
    context = multiprocessing.get_context("fork")   # the claim needs no torch
    claimed = context.Queue()

    def start() -> multiprocessing.Process:
        proc = context.Process(target=_claim_and_hold, args=(2, str(tmp_path), claimed))
        proc.start()
        return proc

    procs = [start() for _ in range(3)]
    try:
        got = dict(claimed.get(timeout=30) for _ in procs)
        assert sorted(got.values(), key=str) == [0, 1, None], got   # two devices, three asking
        holder = next(p for p in procs if got[p.pid] == 0)
        os.kill(holder.pid, signal.SIGKILL)   # the kernel drops its lock with it
        holder.join(30)
        procs.append(start())
        assert claimed.get(timeout=30) == (procs[-1].pid, 0)
    finally:
        for proc in procs:
            proc.kill()
            proc.join(30)


def test_the_lock_folder_follows_the_visible_devices():
    assert lock_folder("0,1") != lock_folder("2,3") != lock_folder("")
    assert lock_folder("").name == "spotlight-devices-all"


def test_a_count_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="count 0"):
        claim_device_slot(0, tmp_path)


def _slots(client) -> dict[str, int | None]:
    def slot() -> int | None:
        held = held_device_slot()
        return None if held is None else held.index

    return client.run(slot)


def test_each_worker_of_a_node_computes_on_a_device_of_its_own(tmp_path):
    """Four workers of a node with four devices (the embedded cluster's, as `dask worker
    --nworkers 4` starts them): four distinct devices; a worker SIGKILLed, its nanny's new
    process takes the device it left."""
    config = ClusterConfig(gpu_workers=3, spot_workers=1, dashboard=False, devices_per_node=4,
                           worker_wait_s=120)
    handle = start_embedded(config, log_file=tmp_path / "dask.log")
    try:
        client = handle.client
        slots = _slots(client)
        assert sorted(slots.values()) == [0, 1, 2, 3], slots
        victim = next(w for w, index in slots.items() if index == 2)
        [pid] = client.run(os.getpid, workers=[victim]).values()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:
            now = live_workers(client)
            if len(now) == 4 and victim not in now:
                break
            assert time.monotonic() < deadline, f"the killed worker did not come back: {now}"
            time.sleep(0.1)
        after = _slots(client)
        assert sorted(after.values()) == [0, 1, 2, 3], after
        [newcomer] = set(after) - set(slots)
        assert after[newcomer] == 2, after   # the device its predecessor held
    finally:
        handle.close()


def test_stock_workers_started_as_on_a_gpu_vm_each_take_a_device(tmp_path):
    """The VM recipe: `dask worker ADDR --nworkers 3` on a node of 3 devices; the driver
    registers the project's set-up on connect, as a run does."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", *args], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
             for args in (("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                           str(port), "--no-dashboard"),
                          ("distributed.cli.dask_worker", address, "--resources", "gpu=1",
                           "--nworkers", "3", "--nthreads", "1", "--no-dashboard"))]
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            register_worker_setup(client, ClusterConfig(scheduler=address, devices_per_node=3),
                                  embedded=False)
            slots = _slots(client)
            assert sorted(slots.values()) == [0, 1, 2], slots
    finally:
        for proc in procs:
            kill_tree(proc)


def test_the_node_launcher_runs_a_worker_per_gpu_and_passes_sigterm_on(tmp_path):
    """A pod's or SLURM job's main process (`python -m pipelines.cluster.node --workers 3`):
    three stock workers without nannies, each on its own device; one SIGKILLed is started
    again; the launcher's SIGTERM reaches every worker, and all of them end."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard"], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    said = open(tmp_path / "node.log", "w")   # the launcher's and its workers' own lines
    node = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cluster.node", "--workers", "3", "--", address,
         "--name", "node7", "--resources", "gpu=1", "--nthreads", "1", "--no-dashboard"],
        cwd=tmp_path, stdout=said, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            names = {w["name"] for w in client.scheduler_info()["workers"].values()}
            assert names == {"node7-0", "node7-1", "node7-2"}
            register_worker_setup(client, ClusterConfig(scheduler=address, devices_per_node=3),
                                  embedded=False)
            assert sorted(_slots(client).values()) == [0, 1, 2]
            pids = client.run(os.getpid)
            victim = sorted(pids)[0]
            os.kill(pids[victim], signal.SIGKILL)
            deadline = time.monotonic() + 120
            while True:   # one look at a time: the victim may still be listed beside two others
                now = live_workers(client)
                if len(now) == 3 and victim not in now:
                    break
                assert time.monotonic() < deadline, "the launcher did not start another worker"
                time.sleep(0.2)
            survivors = set(client.run(os.getpid).values())
            assert len(survivors) == 3
            os.kill(node.pid, signal.SIGTERM)
            assert node.wait(timeout=120) == 0, (tmp_path / "node.log").read_text()[-3000:]
        for pid in survivors:   # every worker ended with its launcher
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        log = (tmp_path / "node.log").read_text()
        assert log.count("Received signal SIGTERM") == 3, log[-3000:]   # each heard it
    finally:
        kill_tree(node)
        kill_tree(scheduler)
        said.close()
