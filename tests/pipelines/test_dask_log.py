"""The embedded cluster's own Dask messages go to the run's log file, not the user's console.

The driver runs as a separate process (as `spotlight` does): under pytest, Dask installs no
console handler of its own in this process, so only a real driver shows what a user sees.
"""
from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap

import pytest

from pipelines.cluster.dask_log import RUN_LOG, DaskLogRoute, run_log_file

pytestmark = pytest.mark.timeout(300)

DRIVER = textwrap.dedent('''
    import logging, os, signal, sys, time

    from pipelines.cluster import start_embedded
    from spotlight.config import ClusterConfig

    def dask_error():   # what Dask's nanny code logs in a worker process torn down under it
        logging.getLogger("distributed.nanny").error(
            "Worker process died unexpectedly\\nTraceback (most recent call last):\\nTypeError: x")

    def project_warning():
        logging.getLogger("pipelines.cluster").warning("project warning from a worker")

    if __name__ == "__main__":
        handle = start_embedded(ClusterConfig(gpu_workers=1, spot_workers=0, dashboard=False),
                                log_file=sys.argv[1])
        try:
            pids = handle.client.run(os.getpid)
            [victim] = pids.values()
            os.kill(victim, signal.SIGKILL)            # a preemption without notice
            print("killed", victim, flush=True)
            deadline = time.monotonic() + 120
            while True:   # the nanny starts a fresh process
                try:
                    now = handle.client.run(os.getpid)
                except Exception:   # the victim's last call failed: ask again
                    now = {}
                if len(now) == 1 and victim not in now.values():
                    break
                assert time.monotonic() < deadline, "no worker came back"
                time.sleep(0.2)
            handle.client.run(dask_error)
            handle.client.run(project_warning)
            logging.getLogger("distributed.scheduler").error("a driver-side Dask error")
            try:
                handle.client.submit(int, "not a number", pure=False).result()
            except ValueError as err:
                print("task error reached the driver:", err, flush=True)
        finally:
            handle.close()
        # after the cluster, Dask's console handler is back
        logging.getLogger("distributed.client").warning("dask warning after the cluster closed")
''')

DASK_LINES = ("Worker process", "died unexpectedly", "TypeError", "Restarting worker",
              "was killed by signal", "a driver-side Dask error", "distributed.")


def test_dask_messages_of_killed_workers_go_to_the_log_file_not_the_console(tmp_path, capfd):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    log = tmp_path / "run" / "logs" / "dask.log"
    capfd.readouterr()
    done = subprocess.run([sys.executable, str(script), str(log)], cwd=tmp_path, timeout=240)
    out, err = capfd.readouterr()
    assert done.returncode == 0, out + err
    killed = int(out.split("killed", 1)[1].split()[0])
    console = "\n".join(line for line in (out + err).splitlines()
                        if "dask warning after the cluster closed" not in line)
    assert not [line for line in DASK_LINES if line in console], console
    # What is the project's own still reaches the user: a worker's warning, a task's error.
    assert "project warning from a worker" in err
    assert "task error reached the driver: invalid literal for int()" in out
    assert "dask warning after the cluster closed" in err
    text = log.read_text()
    assert f"distributed.nanny INFO: Worker process {killed} was killed by signal 9" in text
    assert "Restarting worker" in text and "a driver-side Dask error" in text
    died = [line for line in text.splitlines() if "Worker process died unexpectedly" in line]
    assert died and died[0].split(" pid ")[0].endswith("worker gpu-0"), died
    assert "TypeError: x" in text and "project warning" not in text


def test_a_run_logs_inside_itself_on_a_file_system_and_in_the_cache_otherwise(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "runs").mkdir()   # the user's folder of runs
    inside = run_log_file(str(tmp_path / "runs" / "a"))
    assert inside.inside_run and inside.path == tmp_path.joinpath("runs", "a", *RUN_LOG)
    assert run_log_file(f"file://{tmp_path}/runs/a").path == inside.path
    remote = run_log_file("s3://bucket/prefix/run-7")
    assert not remote.inside_run and remote.path.parent == tmp_path / "cache" / "logs"
    assert remote.path.name.startswith("bucket-prefix-run-7-")
    # A run refused before its store was written leaves nothing behind: the folders made for
    # its log go with it, the user's folder stays.
    inside.path.parent.mkdir(parents=True)
    inside.path.write_text("x\n")
    inside.forget()
    assert (tmp_path / "runs").is_dir() and list((tmp_path / "runs").iterdir()) == []


def test_routes_of_clusters_alive_at_once_share_the_console_and_give_it_back(tmp_path):
    dask_root, nanny = logging.getLogger("distributed"), logging.getLogger("distributed.nanny")
    console = logging.StreamHandler(io.StringIO())   # as Dask's own, on stderr
    dask_root.addHandler(console)
    propagate = dask_root.propagate
    try:
        first = DaskLogRoute(tmp_path / "first.log").start()
        second = DaskLogRoute(tmp_path / "second.log").start()
        nanny.warning("while both live")
        first.stop()
        nanny.warning("while the second lives")
        second.stop()
        nanny.warning("after both")
        assert console.stream.getvalue() == "after both\n"
        assert dask_root.propagate == propagate
    finally:
        dask_root.removeHandler(console)
    first_text = (tmp_path / "first.log").read_text()
    assert "while both live" in first_text and "while the second lives" not in first_text
    second_text = (tmp_path / "second.log").read_text()
    assert "driver pid" in second_text and "distributed.nanny WARNING: while the second lives" \
        in second_text and "after both" not in second_text
