"""Spotlight as a user runs it: `spotlight run` against a real `dask scheduler` and stock
`dask worker` processes (default options, an empty working folder), workers killed mid-run,
Ctrl-C, and the embedded cluster's listening sockets."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from pipelines.bench.testbed import kill as kill_tree
from tests.pipelines.conftest import run_quick_bench
from tests.ports import free_port

pytestmark = pytest.mark.timeout(420)
CLI = [sys.executable, "-c", "import sys; from spotlight import main; sys.exit(main(sys.argv[1:]))"]


@pytest.fixture(scope="module")
def stock_cluster(tmp_path_factory):
    """`dask scheduler` plus `dask worker ADDR --resources X=1` (nothing else) in an empty
    folder, shared by the module's tests: the one that kills every worker comes last."""
    folder = tmp_path_factory.mktemp("cluster-cwd")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)   # its own group: kill it with its child
        procs.append(proc)
        return proc

    start("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
          "--no-dashboard")
    workers = [start("distributed.cli.dask_worker", address, "--resources", f"{cls}=1")
               for cls in ("gpu", "spot")]
    yield address, workers, folder
    for proc in procs:
        kill_tree(proc)


def _wait_for_stage(store, stage: str, proc: subprocess.Popen, limit_s: float = 240) -> None:
    manifest = store / "manifest.json"
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if manifest.exists() and f'"{stage}"' in manifest.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"stage {stage} never appeared")


def test_stock_workers_run_an_iteration(stock_cluster, tiny_run_yaml, tmp_path):
    address, _, folder = stock_cluster
    store = tmp_path / "run"
    done = subprocess.run(CLI + ["run", "--config", str(tiny_run_yaml), "--iterations", "2",
                                 "--scheduler", address, "--store", str(store)],
                          capture_output=True, text=True, timeout=360, cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    from storage import RunStore

    run = RunStore.open(str(store), create=False)
    stored = run.manifest.read()["run"]["config"]   # resolved files, usable from any folder
    for path in (stored["world"]["train_prompts"], stored["world"]["val_prompts"],
                 stored["cost"]["prices"]):
        assert os.path.isabs(path) and os.path.isfile(path), path
    records = [r for k in range(2) for r in run.get_json(f"iter-{k}/iteration", "tasks")["tasks"]]
    workers = {r["stage"]: r["worker"] for r in records}
    assert {"rollout", "train", "explore"} <= set(workers)
    assert workers["rollout"] != workers["explore"]   # gpu and spot workers, by resource


def test_killing_every_worker_ends_the_run_with_one_clear_line(stock_cluster, tiny_run_yaml,
                                                                tmp_path):
    address, workers, folder = stock_cluster
    store = tmp_path / "run"
    proc = subprocess.Popen(CLI + ["run", "--config", str(tiny_run_yaml), "--iterations", "4",
                                   "--scheduler", address, "--store", str(store),
                                   "--set", "cluster.worker_wait_s=10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder)
    try:
        _wait_for_stage(store, "iter-000000/train", proc)
        killed_at = time.monotonic()
        for worker in workers:
            os.killpg(worker.pid, signal.SIGKILL)   # the nanny and its worker process
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, out + err
    assert "Traceback" not in err
    assert "no worker with resource 'gpu' left" in err and "--resume" in err, err
    assert took < 10 + 60, took   # worker_wait_s, plus what a stage needs to notice
    # what was committed stays: the store opens and iteration 0's training is recorded
    from storage import RunStore

    assert RunStore.open(str(store), create=False).stage_record("iter-0/train") is not None


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_ctrl_c_stops_the_run_and_resume_finishes_it(tiny_run_yaml, tmp_path):
    store = tmp_path / "run"
    proc = subprocess.Popen(CLI + ["run", "--config", str(tiny_run_yaml), "--iterations", "3",
                                   "--store", str(store)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True)
    try:
        _wait_for_stage(store, "iter-000001/rollout", proc)
        family = _tree(proc.pid)
        assert len(family) >= 3   # the driver and its worker processes
        os.killpg(proc.pid, signal.SIGINT)   # what a terminal's Ctrl-C does
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "interrupted" in err
    assert f"spotlight run --resume {store.as_uri()}" in err or "--resume" in err
    time.sleep(2)
    left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {left}"
    from storage import RunStore

    done_before = sum(RunStore.open(str(store), create=False).stage_record(f"iter-{k}/iteration")
                      is not None for k in range(3))
    assert done_before < 3   # it really stopped early
    done = subprocess.run(CLI + ["run", "--resume", str(store)], capture_output=True, text=True,
                          timeout=360, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run = RunStore.open(str(store), create=False)
    assert all(run.stage_record(f"iter-{k}/iteration") is not None for k in range(3))


def test_an_embedded_run_listens_on_loopback_only(tiny_run_config, tmp_path):
    from pipelines.front.session import Session

    seen: set[tuple[str, int]] = set()
    stop = threading.Event()
    # Only what the run starts: this process and its new children (not the module's shared
    # stock scheduler, whose HTTP server listens on every interface by Dask's default).
    others = {p.pid for p in _tree(os.getpid())} - {os.getpid()}

    def sample(root: int) -> None:
        while not stop.wait(0.2):
            pids = {p.pid for p in _tree(root)} - others
            for conn in psutil.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
                    seen.add((conn.laddr.ip, conn.laddr.port))

    watcher = threading.Thread(target=sample, args=(os.getpid(),), daemon=True)
    watcher.start()
    try:
        with Session.from_config(tiny_run_config, store=str(tmp_path / "run")) as session:
            session.run(1)
    finally:
        stop.set()
        watcher.join()
    # the scheduler, two nannies and two workers: Dask RPC only (cluster.dashboard: false)
    assert len(seen) >= 5, seen
    assert {ip for ip, _ in seen} == {"127.0.0.1"}, seen


def test_bench_stock_workers_quick_computes_what_the_embedded_cluster_computes(
        tiny_run_yaml, tmp_path, outside_repo):
    result, _ = run_quick_bench("stock-workers", ["--config", str(tiny_run_yaml)], outside_repo,
                                tmp_path / "stock.json", timeout=400)
    for key in ("embedded_s_per_iteration", "stock_s_per_iteration", "stock_over_embedded",
                "identical_rewards", "machine", "wall_s"):
        assert key in result, key
    assert result["identical_rewards"] is True
    assert len(result["walls"]["stock"]) == len(result["walls"]["embedded"]) == 1
