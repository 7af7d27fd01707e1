"""Deployment fixtures: certificates as `spotlight deploy certificates` writes them, and the
command line run in-process."""
from __future__ import annotations

import shlex

import pytest

from pipelines.deploy.certificates import make_pki
from pipelines.front.cli import main


@pytest.fixture
def pki(tmp_path):
    """A CA, node and client certificates in one folder (what the deploy commands expect)."""
    return make_pki(tmp_path / "pki", [])


@pytest.fixture
def tls_settings(pki):
    """The driver's cluster.tls settings, as --set arguments."""
    return [arg for key, value in pki.run_settings().items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture
def spotlight(capsys):
    """Run ``spotlight ARGS`` in this process: (exit code, stdout, stderr)."""
    def run(*args: str):
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def worker_options(command: list[str]) -> dict:
    """The options of a ``dask worker`` command line, parsed by distributed's own CLI (an
    option it does not know, or a certificate path that does not exist, fails here)."""
    from distributed.cli.dask_worker import main as dask_worker

    return dask_worker.make_context("dask-worker", list(command)).params


def scheduler_options(command: list[str]) -> dict:
    from distributed.cli.dask_scheduler import main as dask_scheduler

    return dask_scheduler.make_context("dask-scheduler", list(command)).params


def split(line: str) -> list[str]:
    return shlex.split(line)
