"""SLURM job scripts for the two worker classes, written with dask-jobqueue's ``SLURMJob``.

One script per class: ``gpu`` workers on an on-demand partition, ``spot`` workers on a
preemptible one. Each is a job array (one worker per array task) of stock ``dask worker``
processes that join a scheduler you start yourself, with the class in ``--resources`` -- a
worker per GPU where a job has several (:mod:`pipelines.cluster.node`). A spot
job is requeued when preempted, so the pool refills when capacity returns; SLURM's SIGTERM
before the kill reaches the worker itself (no nanny), whose preemption watch hands its
requests back. dask-jobqueue (``pip install -e '.[deploy]'`` in the checkout) only formats the
script here: no scheduler starts and nothing is submitted.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.cluster.cloud_class import ENV
from pipelines.cluster.connect import GPU, SPOT, SPOTLIGHT_PAGE

PRELOAD = "pipelines.cluster.cloud_class"
TLS_FILES = ("ca.pem", "node.pem", "node.key")   # as `spotlight deploy certificates` names them


@dataclass(frozen=True)
class SlurmOptions:
    """What the job scripts need; :mod:`pipelines.deploy.cli` fills it from the run config and
    the command line."""
    scheduler: str                      # tls://HOST:PORT of the scheduler the workers join
    gpu_workers: int = 1
    spot_workers: int = 1
    threads: int = 1
    gpu_partition: str = "gpu"
    spot_partition: str = "preemptible"
    gpus_per_worker: int = 1
    cpus: int = 0                       # CPUs per job; 0: the worker's threads
    memory: str = "64GB"
    walltime: str = "24:00:00"
    account: str = ""
    python: str = sys.executable        # the interpreter of the shared install on the nodes
    tls_dir: str = ""                   # ca.pem, node.pem, node.key on the shared file system
    log_dir: str = ""                   # the jobs' output; "": OUT/logs (SLURM opens it first)
    clouds: str = ""                    # cloud metadata to watch (SLURM in a cloud); "": none
    prologue: tuple[str, ...] = ()      # shell lines before the worker starts
    directives: tuple[str, ...] = ()    # extra #SBATCH lines for both classes

    def __post_init__(self) -> None:
        scheme = self.scheduler.partition("://")[0] if "://" in self.scheduler else ""
        wanted = "tls" if self.tls_dir else "tcp"
        if scheme != wanted or not self.scheduler.rpartition(":")[2].isdigit():
            why = "TLS, with the certificates of --tls-dir" if self.tls_dir else "--no-tls"
            raise ValueError(f"--scheduler {self.scheduler!r}: expected {wanted}://HOST:PORT "
                             f"({why})")
        if self.gpu_workers < 1 or self.spot_workers < 0 or self.gpus_per_worker < 0:
            raise ValueError(f"workers: {self.gpu_workers} gpu (>= 1 needed), "
                             f"{self.spot_workers} spot (>= 0), {self.gpus_per_worker} GPUs "
                             "per worker (>= 0)")
        spaced = [v for v in (self.python, self.tls_dir, self.log_dir)
                  if any(c.isspace() for c in v)]
        if spaced:   # dask-jobqueue joins the command line with spaces and quotes nothing
            raise ValueError(f"paths with spaces cannot go into a job script: {spaced}")

    def partition(self, worker_class: str) -> str:
        return self.gpu_partition if worker_class == GPU else self.spot_partition

    def workers(self, worker_class: str) -> int:
        return self.gpu_workers if worker_class == GPU else self.spot_workers


def _security(opts: SlurmOptions):
    # distributed is imported here with dask-jobqueue: only `deploy slurm` needs either.
    from distributed.security import Security

    if not opts.tls_dir:
        return None
    ca, cert, key = (str(Path(opts.tls_dir) / name) for name in TLS_FILES)
    return Security(tls_ca_file=ca, tls_worker_cert=cert, tls_worker_key=key)


def _directives(opts: SlurmOptions, worker_class: str) -> list[str]:
    name = f"spotlight-{worker_class}"
    lines = [f"--array=1-{opts.workers(worker_class)}"]
    if opts.log_dir:   # else SLURM's default, slurm-JOB_TASK.out where sbatch ran
        lines += [f"-o {opts.log_dir}/{name}-%A_%a.out", f"-e {opts.log_dir}/{name}-%A_%a.err"]
    if opts.gpus_per_worker:
        lines.append(f"--gres=gpu:{opts.gpus_per_worker}")
    if worker_class == SPOT:   # preempted: back in the queue, a new spot worker when it runs
        lines.append("--requeue")
    return lines + list(opts.directives)


def job_script(opts: SlurmOptions, worker_class: str) -> str:
    """The sbatch script of one worker class (dask-jobqueue formats it; nothing starts)."""
    try:   # the optional extra [deploy]
        from dask_jobqueue.slurm import SLURMJob
    except ImportError:
        raise ValueError("`spotlight deploy slurm` needs dask-jobqueue: pip install -e "
                         "'.[deploy]' in the Spotlight checkout") from None
    threads = str(opts.threads)
    prologue = [f"export OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads}", *opts.prologue]
    extra = ["--resources", f"{worker_class}=1"]
    if opts.clouds:
        prologue.append(f"export {ENV['clouds']}={opts.clouds}")
        extra += ["--preload", PRELOAD]
    # A job of several GPUs runs a worker per GPU under pipelines.cluster.node (no nanny, the
    # signal passed on to each); dask-jobqueue splits the job's cores and memory between them.
    per_job = max(1, opts.gpus_per_worker)
    node = {} if per_job == 1 else {
        "worker_command": f"pipelines.cluster.node --workers {per_job} --"}
    job = SLURMJob(
        scheduler=opts.scheduler, name=f"spotlight-{worker_class}-${{SLURM_JOB_ID}}",
        job_name=f"spotlight-{worker_class}", queue=opts.partition(worker_class),
        account=opts.account or None, walltime=opts.walltime, cores=opts.threads * per_job,
        job_cpu=opts.cpus or None, memory=opts.memory, processes=per_job, nanny=False, **node,
        security=_security(opts), python=opts.python, worker_extra_args=extra,
        job_extra_directives=_directives(opts, worker_class), job_script_prologue=prologue,
        job_directives_skip=(), shebang="#!/usr/bin/env bash", log_directory=None)
    return job.job_script()


def write_scripts(opts: SlurmOptions, out_dir: str | Path) -> dict[str, Path]:
    """Write ``spotlight-gpu.sbatch`` and (with spot workers) ``spotlight-spot.sbatch``; the
    default log folder ``OUT/logs`` is made too: SLURM opens a job's output before it runs."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not opts.log_dir:
        opts = dataclasses.replace(opts, log_dir=str(out / "logs"))
        Path(opts.log_dir).mkdir(exist_ok=True)
    written = {}
    for worker_class in (GPU, SPOT):
        if opts.workers(worker_class):
            path = out / f"spotlight-{worker_class}.sbatch"
            path.write_text(job_script(opts, worker_class))
            written[worker_class] = path
    return written


def scheduler_command(opts: SlurmOptions) -> str:
    """The stock scheduler the workers join, for a host the compute nodes reach."""
    host, _, port = opts.scheduler.partition("://")[2].rpartition(":")
    tls = ""
    if opts.tls_dir:
        ca, cert, key = (str(Path(opts.tls_dir) / name) for name in TLS_FILES)
        tls = f" --protocol tls --tls-ca-file {ca} --tls-cert {cert} --tls-key {key}"
    return f"dask scheduler --host {host} --port {port} --preload {SPOTLIGHT_PAGE}{tls}"
