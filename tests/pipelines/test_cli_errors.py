"""Every mistake a user can make at the command line ends in one line, an exit code, and no
store."""
from __future__ import annotations

import http.server
import subprocess
import sys
import threading

import pytest
import yaml

from pipelines.front.cli import main
from tests.pipelines.conftest import TINY_RUN

pytestmark = pytest.mark.timeout(120)   # "exits within two minutes"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working folder: the default store (runs/...) would appear here."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_RUN))
    return tmp_path


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _bad_trace(root):
    path = root / "trace.csv"
    path.write_text("0,add,n1\n1000,remove\n")
    return str(path)


def _list_yaml(root):
    path = root / "list.yaml"
    path.write_text("- grpo\n- sampler\n")
    return str(path)


def _broken_yaml(root):
    path = root / "broken.yaml"
    path.write_text("grpo:\n  lr: [2e-4\n  group_size: 8\n")
    return str(path)


CASES = {
    "list-not-int": (lambda r: ["run", "--config", "tiny.yaml", "--set", "planner.candidates=16"],
                     2, "planner.candidates"),
    "into-a-value": (lambda r: ["run", "--config", "tiny.yaml", "--set", "seed.x=1"], 2, "seed"),
    "not-a-number": (lambda r: ["run", "--config", "tiny.yaml", "--set", "grpo.lr=abc"], 2,
                     "grpo.lr"),
    "top-level-list": (lambda r: ["run", "--config", _list_yaml(r)], 2, "top level"),
    "yaml-syntax": (lambda r: ["run", "--config", _broken_yaml(r)], 2, "broken.yaml:"),
    "missing-prompts": (lambda r: ["run", "--config", "tiny.yaml", "--set",
                                   "world.train_prompts=nope.txt"], 2, "nope.txt"),
    "malformed-trace": (lambda r: ["run", "--config", "tiny.yaml", "--preempt-trace",
                                   _bad_trace(r)], 2, "trace.csv:2"),
    "reward-vs-task": (lambda r: ["run", "--config", "tiny.yaml", "--set", "reward.name=geneval"],
                       2, "reward.name"),
    "resume-missing": (lambda r: ["run", "--resume", str(r / "no-such-run")], 3,
                       "no Spotlight run"),
    "resume-with-set": (lambda r: ["run", "--resume", str(r / "no-such-run"), "--set",
                                   "grpo.lr=1e-4"], 2, "--set would change it"),
    "audit-missing": (lambda r: ["audit", str(r / "no-such-run")], 3, "no Spotlight run"),
    "negative-patience": (lambda r: ["run", "--config", "tiny.yaml", "--store-patience", "-5"],
                          2, "--store-patience -5: a number of seconds >= 0"),
    "zero-lease": (lambda r: ["run", "--config", "tiny.yaml", "--lease-ttl", "0"],
                   2, "--lease-ttl 0: a number of seconds from 1 to 86400"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mistakes_end_in_one_line_and_create_no_store(case, workdir, capsys):
    argv, code, named = CASES[case]
    argv = argv(workdir)
    before = _files(workdir)
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ")
    assert named in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _files(workdir) == before, "nothing may be written"


@pytest.fixture
def http_server():
    """Something on a loopback port that is not a Dask scheduler."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_scheduler_address_that_is_an_http_server_fails_in_time(workdir, http_server):
    """A real process, as a user runs it: no hang, one line, the cluster exit code, no store."""
    before = _files(workdir)
    done = subprocess.run([sys.executable, "-m", "pipelines.front.cli", "run", "--config",
                           "tiny.yaml", "--scheduler", http_server, "--set",
                           "cluster.connect_timeout_s=3"],
                          capture_output=True, text=True, timeout=110, cwd=workdir)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    assert http_server in done.stderr and "Dask scheduler" in done.stderr
    assert _files(workdir) == before


def test_debug_adds_the_traceback(workdir, capsys):
    assert main(["run", "--config", "tiny.yaml", "--set", "grpo.lr=abc", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_a_closed_scheduler_connection_is_a_cluster_error_not_a_file_system_one():
    """Dask's CommClosedError is an OSError: raised bare, or as the cause of another error,
    when the scheduler goes away, it must read as the cluster's loss (exit 4, how to resume),
    never as "file system" (exit 3)."""
    from distributed.comm.core import CommClosedError

    from pipelines.front.cli import EXIT_CLUSTER, EXIT_STORAGE, _classify

    closed = CommClosedError("in <TCP (closed) ConnectionPool.identity local=... remote=...>")
    try:
        try:
            raise closed
        except CommClosedError as err:
            raise RuntimeError("the dispatch pool stopped") from err
    except RuntimeError as wrapped:
        chained = wrapped
    for err in (closed, chained):
        code, line = _classify(err)
        assert code == EXIT_CLUSTER and "--resume" in line, line
    assert _classify(FileNotFoundError(2, "No such file", "/nowhere"))[0] != EXIT_CLUSTER
    assert _classify(PermissionError(13, "denied", "/root"))[0] == EXIT_STORAGE
