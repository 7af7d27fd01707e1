"""`spotlight deploy slurm`: one job script per worker class, formatted by dask-jobqueue's
SLURMJob, checked line by line and parsed with distributed's own `dask worker` command line.
Generating starts no scheduler and submits nothing."""
from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
from contextlib import contextmanager
from pathlib import Path

import dask_jobqueue.core
import distributed
import pytest

from pipelines.cluster.node import worker_command
from pipelines.deploy.slurm import PRELOAD, TLS_FILES, SlurmOptions, job_script, scheduler_command
from tests.deploy.conftest import worker_options

SCHEDULER = "tls://10.0.0.5:8786"


@contextmanager
def nothing_starts():
    """Inside it, any attempt to start a scheduler, submit a job or run a process fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("deploy slurm started or submitted something")

    async def refuse_async(*args, **kwargs):
        refuse()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed.Scheduler, "__init__", refuse)
        mp.setattr(dask_jobqueue.core.Job, "_call", refuse_async)
        mp.setattr(subprocess, "Popen", refuse)
        mp.setattr(asyncio, "create_subprocess_exec", refuse_async)
        yield


def _lines(script: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in script.splitlines() if line.startswith(prefix)]


def _worker_command(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if "distributed.cli.dask_worker" in line]
    return shlex.split(line)


@pytest.fixture
def scripts(tmp_path, pki, tls_settings, spotlight):
    out = tmp_path / "jobs"
    with nothing_starts():
        code, stdout, err = spotlight(
            "deploy", "slurm", "--out", str(out), "--scheduler", SCHEDULER,
            "--gpu-partition", "a100", "--spot-partition", "a100-preempt", "--account", "proj7",
            "--python", "/shared/venv/bin/python", "--prologue",
            "source /shared/venv/bin/activate", "--sbatch", "qos=normal",
            "--set", "cluster.gpu_workers=2", "--set", "cluster.spot_workers=6",
            "--set", "cluster.threads_per_worker=8", *tls_settings)
    assert code == 0, err
    return {cls: (out / f"spotlight-{cls}.sbatch").read_text() for cls in ("gpu", "spot")}, \
        stdout, out


@pytest.mark.parametrize("worker_class,partition,count", [("gpu", "a100", 2),
                                                          ("spot", "a100-preempt", 6)])
def test_each_class_is_a_job_array_on_its_partition(scripts, worker_class, partition, count):
    script = scripts[0][worker_class]
    directives = _lines(script, "#SBATCH")
    assert f"-p {partition}" in directives and "-A proj7" in directives
    assert f"--array=1-{count}" in directives
    assert "--gres=gpu:1" in directives and "--cpus-per-task=8" in directives
    assert "--qos=normal" in directives
    assert ("--requeue" in directives) == (worker_class == "spot")   # preempted: requeued
    log_dir = scripts[2] / "logs"
    assert f"-o {log_dir}/spotlight-{worker_class}-%A_%a.out" in directives and log_dir.is_dir()
    assert script.startswith("#!/usr/bin/env bash\n")


@pytest.mark.parametrize("worker_class", ["gpu", "spot"])
def test_the_worker_command_is_a_stock_dask_worker_of_its_class(scripts, pki, worker_class):
    script = scripts[0][worker_class]
    command = _worker_command(script)
    assert command[:3] == ["/shared/venv/bin/python", "-m", "distributed.cli.dask_worker"]
    options = worker_options(command[3:])
    assert options["scheduler"] == SCHEDULER
    assert options["resources"] == f"{worker_class}=1"
    assert options["nanny"] is False and options["nthreads"] == 8
    folder = Path(pki.ca_file).parent
    assert [options["tls_ca_file"], options["tls_cert"], options["tls_key"]] == \
        [str(folder / name) for name in TLS_FILES]
    assert re.fullmatch(rf"spotlight-{worker_class}-\$\{{SLURM_JOB_ID\}}", options["name"])
    lines = script.splitlines()
    worker_line = next(i for i, line in enumerate(lines) if "dask_worker" in line)
    assert lines.index("export OMP_NUM_THREADS=8 MKL_NUM_THREADS=8") < worker_line
    assert lines.index("source /shared/venv/bin/activate") < worker_line


def test_the_scripts_are_valid_bash(scripts):
    for script in scripts[0].values():
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_printed_next_steps(scripts, pki):
    _, out, folder = scripts
    assert f"sbatch {folder}/spotlight-gpu.sbatch && sbatch {folder}/spotlight-spot.sbatch" in out
    assert ("dask scheduler --host 10.0.0.5 --port 8786 --preload "
            f"pipelines.observe.dashboard_page --protocol tls --tls-ca-file {pki.ca_file}") in out
    assert f"spotlight run --config configs/digits.yaml --scheduler {SCHEDULER}" in out


def test_in_a_cloud_the_workers_also_watch_its_metadata(tmp_path):
    opts = SlurmOptions(scheduler="tcp://login:8786", clouds="aws", spot_workers=0,
                        gpus_per_worker=0, python="python3", log_dir=str(tmp_path))
    with nothing_starts():
        script = job_script(opts, "spot")
    options = worker_options(_worker_command(script)[3:])
    assert options["preload"] == (PRELOAD,) and options["resources"] == "spot=1"
    assert "export SPOTLIGHT_CLOUDS=aws" in script
    assert not any(d.startswith("--gres") for d in _lines(script, "#SBATCH"))
    assert scheduler_command(opts) == ("dask scheduler --host login --port 8786 "
                                       "--preload pipelines.observe.dashboard_page")


def test_a_job_of_four_gpus_runs_a_worker_per_gpu_under_the_node_launcher(tmp_path):
    """No `--nworkers` (it needs nannies, which would take SLURM's SIGTERM from the workers):
    pipelines.cluster.node starts four stock workers, the job's cores and memory split."""
    opts = SlurmOptions(scheduler="tcp://login:8786", gpus_per_worker=4, threads=2,
                        memory="64GB", python="python3", log_dir=str(tmp_path))
    with nothing_starts():
        script = job_script(opts, "gpu")
    assert "--gres=gpu:4" in _lines(script, "#SBATCH")
    assert "--cpus-per-task=8" in _lines(script, "#SBATCH")
    (line,) = [line for line in script.splitlines() if "pipelines.cluster.node" in line]
    argv = shlex.split(line)
    assert argv[:6] == ["python3", "-m", "pipelines.cluster.node", "--workers", "4", "--"]
    assert "--nworkers" not in argv
    command = worker_command(argv[6:], 2)
    options = worker_options(command[3:])
    assert options["scheduler"] == "tcp://login:8786" and options["nthreads"] == 2
    assert options["nanny"] is False and options["resources"] == "gpu=1"
    assert options["name"] == "spotlight-gpu-${SLURM_JOB_ID}-2"
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_no_spot_workers_writes_only_the_gpu_script(tmp_path, spotlight):
    with nothing_starts():
        code, _, err = spotlight("deploy", "slurm", "--out", str(tmp_path), "--no-tls",
                                 "--scheduler", "tcp://login:8786", "--spot-workers", "0")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.glob("*.sbatch")) == ["spotlight-gpu.sbatch"]


@pytest.mark.parametrize("argv,needle", [
    (["--scheduler", SCHEDULER], "give --tls-dir DIR"),
    (["--no-tls"], "give --scheduler tls://HOST:8786"),
    (["--no-tls", "--scheduler", SCHEDULER], "expected tcp://HOST:PORT (--no-tls)"),
    (["--no-tls", "--scheduler", "tcp://login", "--gpu-workers", "1"], "expected tcp://HOST:PORT"),
    (["--no-tls", "--scheduler", "tcp://login:8786", "--python", "/my env/python"],
     "paths with spaces")])
def test_bad_options_are_usage_errors_that_say_what_to_give(tmp_path, spotlight, argv, needle):
    code, _, err = spotlight("deploy", "slurm", "--out", str(tmp_path / "out"), *argv)
    assert code == 2 and needle in err, err
    assert not (tmp_path / "out").exists()


def test_no_tls_with_a_tls_config_is_refused(tmp_path, spotlight, tls_settings):
    code, _, err = spotlight("deploy", "slurm", "--out", str(tmp_path), "--no-tls",
                             "--scheduler", "tcp://login:8786", *tls_settings)
    assert code == 2 and "the run config sets cluster.tls" in err


def test_the_guard_refuses_what_a_jobqueue_cluster_would_do():
    """The world of these tests: SLURMCluster (which starts a scheduler) fails under it."""
    with nothing_starts(), pytest.raises(RuntimeError, match="started or submitted"):
        dask_jobqueue.SLURMCluster(cores=1, memory="1GB")
