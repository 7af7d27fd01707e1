"""A Spotlight cluster spread over a test bed's hosts, the way users run one on VMs.

Hosts: ``scheduler`` (a stock ``dask scheduler``, TLS only), ``store`` (an S3 server),
``gpu-N`` / ``spot-N`` (stock ``dask worker`` processes with ``--resources``), and ``driver``
(where ``spotlight run`` runs). Certificates are made at start; every process gets the same
S3 endpoint and test credentials through the standard AWS variables.

    with Testbed() as bed:
        cluster = start_bed_cluster(bed, tmp_path)
        proc = cluster.spotlight("run", "--config", path, "--iterations", "1")
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.cluster.classes import scheduler_workers
from pipelines.deploy.certificates import Pki, make_pki
from storage import StorageConfig
from storage.urls import check_reachable, open_location

from .testbed import Host, Testbed, TestbedError, kill

SCHEDULER_PORT, S3_PORT = 8786, 9000
BUCKET = "spotlight-bed"
_KEY, _SECRET = "AKIASPOTLIGHTBEDKEY0", "spotlight-bed-secret-not-a-real-one-0123"
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class BedCluster:
    bed: Testbed
    pki: Pki
    folder: Path
    workers: dict[str, Host] = field(default_factory=dict)
    scheduler_host: str = "scheduler"
    _scheduler: subprocess.Popen | None = None
    _worker_procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def scheduler(self) -> str:
        return f"tls://{self.bed.hosts[self.scheduler_host].ip}:{SCHEDULER_PORT}"

    def start_scheduler(self, host: str = "scheduler") -> None:
        """A stock TLS ``dask scheduler`` on ``host`` (one of the hosts the certificates name)."""
        self.scheduler_host = host
        sched = self.bed.host(host)
        self._scheduler = sched.popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", sched.ip,
             "--port", str(SCHEDULER_PORT), "--protocol", "tls", "--no-dashboard",
             *self.pki.dask_args()], env=self.env(), cwd=self.folder,
            stdout=open(self.folder / f"{host}.log", "ab"), stderr=subprocess.STDOUT)

    def stop_scheduler(self) -> None:
        """The scheduler's host dies: its process is SIGKILLed."""
        if self._scheduler is not None:
            kill(self._scheduler)
            self._scheduler = None

    def restart_scheduler(self, host: str) -> None:
        """A new scheduler on ``host``; the workers (restarted, as their VMs' supervisors
        would) join it."""
        self.stop_scheduler()
        for proc in self._worker_procs.values():
            kill(proc)
        self.start_scheduler(host)
        for name in list(self.workers):
            cls, index = name.rsplit("-", 1)
            self.add_worker(cls, int(index))
        self.wait_for_workers(list(self.workers))

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.bed.hosts['store'].ip}:{S3_PORT}"

    def store_url(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"

    def env(self) -> dict[str, str]:
        """What every process of the cluster (and a reader in the root namespace) needs."""
        return dict(os.environ, AWS_ENDPOINT_URL=self.s3_endpoint, AWS_ACCESS_KEY_ID=_KEY,
                    AWS_SECRET_ACCESS_KEY=_SECRET, AWS_REGION="us-east-1",
                    AWS_EC2_METADATA_DISABLED="true",
                    AWS_REQUEST_CHECKSUM_CALCULATION="WHEN_REQUIRED",
                    AWS_RESPONSE_CHECKSUM_VALIDATION="WHEN_REQUIRED",
                    PYTHONPATH=str(_REPO), OMP_NUM_THREADS="1", NO_PROXY="*")

    def store_config(self, url: str, **overrides) -> StorageConfig:
        """The run store at ``url`` as a reader in the root namespace opens it."""
        return StorageConfig(url=url, endpoint_url=self.s3_endpoint, key=_KEY, secret=_SECRET,
                             region="us-east-1", **overrides)

    def store_env(self) -> dict[str, str]:
        """Only the S3 variables: what a reader of the store in this process sets."""
        return {k: v for k, v in self.env().items() if k.startswith("AWS_")}

    def add_worker(self, cls: str, index: int) -> Host:
        """Start a stock ``dask worker`` of class ``cls`` on its own host; returns the host."""
        name = f"{cls}-{index}"
        host = self.bed.host(name)
        log = open(self.folder / f"{name}.log", "wb")
        self._worker_procs[name] = host.popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.scheduler,
             "--name", name, "--nthreads", "1", "--resources", f"{cls}=1",
             "--host", host.ip, "--no-dashboard", "--memory-limit", "0",
             *self.pki.dask_args()], env=self.env(), cwd=self.folder, stdout=log,
            stderr=subprocess.STDOUT)
        self.workers[name] = host
        return host

    def wait_for_workers(self, names: list[str], limit_s: float = 180.0) -> None:
        from distributed import Client
        from distributed.security import Security

        security = Security(tls_ca_file=self.pki.ca_file, tls_client_cert=self.pki.client_cert,
                            tls_client_key=self.pki.client_key, require_encryption=True)
        deadline = time.monotonic() + limit_s
        with Client(self.scheduler, security=security, timeout=limit_s) as client:
            while True:
                joined = {w.get("name") for w in
                          scheduler_workers(client).values()}
                if set(names) <= joined:
                    return
                if time.monotonic() > deadline:
                    raise TestbedError(f"workers {sorted(set(names) - joined)} never joined "
                                       f"{self.scheduler}; see {self.folder}/*.log")
                time.sleep(0.3)

    def spotlight(self, *args: str, host: str = "driver", **kwargs) -> subprocess.Popen:
        """``spotlight ARGS`` on ``host`` (default: the driver's), with the cluster's TLS."""
        tls = [f"{k}={v}" for k, v in self.pki.run_settings().items()]
        extra = [] if "--resume" in args else [a for kv in tls for a in ("--set", kv)]
        argv = [sys.executable, "-c", "import sys; from spotlight import main; "
                "sys.exit(main(sys.argv[1:]))", *args, *extra]
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        return self.bed.host(host).popen(argv, env=self.env(), cwd=self.folder, text=True,
                                         **kwargs)


def start_bed_cluster(bed: Testbed, folder: str | Path, gpu: int = 1, spot: int = 1,
                      spare: tuple[str, ...] = ()) -> BedCluster:
    """Scheduler, S3 store and workers on their own hosts; returns once every worker joined.
    ``spare`` hosts are made (and named in the certificates) for later: a second driver, a
    new scheduler."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hosts = ["scheduler", "store", "driver"] + [f"gpu-{i}" for i in range(gpu)] + \
        [f"spot-{i}" for i in range(spot)] + list(spare)
    addresses = [bed.host(name).ip for name in hosts]
    cluster = BedCluster(bed, make_pki(folder / "pki", addresses), folder)
    _start_store(cluster)
    cluster.start_scheduler("scheduler")
    for cls, count in (("gpu", gpu), ("spot", spot)):
        for i in range(count):
            cluster.add_worker(cls, i)
    cluster.wait_for_workers(list(cluster.workers))
    return cluster


def _start_store(cluster: BedCluster) -> None:
    store = cluster.bed.hosts["store"]
    proc = store.popen([sys.executable, "-m", "pipelines.bench.serial_s3", store.ip,
                        str(S3_PORT)], env=cluster.env(), cwd=_REPO, stdout=subprocess.PIPE,
                       stderr=open(cluster.folder / "store.log", "wb"), text=True)
    if proc.stdout.readline().strip() != "ready":
        raise TestbedError(f"the S3 server on {store.ip} did not start; see "
                           f"{cluster.folder}/store.log")
    check_reachable(open_location(cluster.store_config(f"s3://{BUCKET}/probe")),
                    create_bucket=True)
