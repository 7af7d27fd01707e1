"""Kubernetes manifests for the dask-kubernetes operator, generated from a run config.

One ``DaskCluster`` (apiVersion ``kubernetes.dask.org/v1``) whose default worker group is the
``gpu`` class -- on-demand nodes only -- and one ``DaskWorkerGroup`` of ``spot`` workers placed
on the provider's spot nodes (node selector and toleration). Every worker is a stock
``dask worker`` of the Spotlight image with its class in ``--resources`` and the cloud
metadata plugin (:mod:`pipelines.cluster.cloud_class`) as a preload, which watches the node's
termination notice on spot pods. Scheduler and workers speak TLS with the node certificate of
a Kubernetes secret mounted at :data:`TLS_MOUNT`.

Workers run without a nanny: the kubelet sends SIGTERM to the container's main process only,
and that must be the worker itself, whose preemption watch hands its requests back on
SIGTERM (a nanny would close it instead); Kubernetes restarts a worker that exits. A pod of
several GPUs (``gpus_per_worker`` > 1) runs a worker per GPU under
:mod:`pipelines.cluster.node`, which passes the signal on to each and restarts one that dies.

Only plain data is built here (dicts, written as YAML); nothing talks to a cluster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.cluster.cloud_class import ENV, PLUGIN_NAME
from pipelines.cluster.connect import GPU, SPOT, SPOTLIGHT_PAGE

API_VERSION = "kubernetes.dask.org/v1"
TLS_MOUNT = "/etc/spotlight/tls"
TLS_FILES = ("ca.pem", "node.pem", "node.key")   # as `spotlight deploy certificates` names them
SCHEDULER_PORT, DASHBOARD_PORT, WORKER_DASHBOARD_PORT = 8786, 8787, 8788
PRELOAD = "pipelines.cluster.cloud_class"
GPU_RESOURCE = "nvidia.com/gpu"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors: a manifest reads the same to every tool."""

    def ignore_aliases(self, data) -> bool:
        return True


@dataclass(frozen=True)
class SpotNodes:
    """How a provider marks its spot nodes, and which metadata service its VMs answer."""
    cloud: str
    label: str
    value: str


PROVIDERS = {
    "gke": SpotNodes("gcp", "cloud.google.com/gke-spot", "true"),
    "eks": SpotNodes("aws", "eks.amazonaws.com/capacityType", "SPOT"),
    "karpenter": SpotNodes("aws", "karpenter.sh/capacity-type", "spot"),
    "aks": SpotNodes("azure", "kubernetes.azure.com/scalesetpriority", "spot"),
}


@dataclass(frozen=True)
class KubeOptions:
    """What the manifests need; :func:`pipelines.deploy.cli` fills it from the run config and
    the command line."""
    image: str
    spot_nodes: SpotNodes
    gpu_workers: int = 1
    spot_workers: int = 1
    threads: int = 1
    gpus_per_worker: int = 1
    name: str = "spotlight"
    namespace: str = "default"
    tls_secret: str = "spotlight-tls"   # empty: no TLS (a private test cluster only)
    env_secret: str = ""                # a secret of AWS_* variables for the run store
    memory: str = ""                    # each worker's memory request and limit, e.g. 64Gi
    grace_s: int = 30                   # a spot pod's time from SIGTERM to SIGKILL
    plugin_env: dict[str, str] = field(default_factory=dict)   # SPOTLIGHT_* of the plugin

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"--name {self.name!r}: a DaskCluster name is lower-case letters, "
                             "digits and '-', starts with a letter, at most 40 characters")
        if self.gpu_workers < 1 or self.spot_workers < 0 or self.gpus_per_worker < 0:
            raise ValueError(f"workers: {self.gpu_workers} gpu (>= 1 needed), "
                             f"{self.spot_workers} spot (>= 0), {self.gpus_per_worker} GPUs "
                             "per worker (>= 0)")

    @property
    def scheduler_address(self) -> str:
        scheme = "tls" if self.tls_secret else "tcp"
        return (f"{scheme}://{self.name}-scheduler.{self.namespace}.svc.cluster.local:"
                f"{SCHEDULER_PORT}")

    @property
    def spot_group(self) -> str:
        return f"{self.name}-spot"


def _tls_args(opts: KubeOptions) -> list[str]:
    if not opts.tls_secret:
        return []
    ca, cert, key = (f"{TLS_MOUNT}/{name}" for name in TLS_FILES)
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


def _tls_volume(opts: KubeOptions) -> dict:
    if not opts.tls_secret:
        return {}
    return {"volumes": [{"name": "tls", "secret": {"secretName": opts.tls_secret,
                                                   "defaultMode": 0o400}}]}


def _env(pairs: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": str(v)} for k, v in pairs.items()]


def worker_args(opts: KubeOptions, worker_class: str) -> list[str]:
    """The worker container's command line (the image's entry point runs it). A pod of several
    GPUs runs a worker per GPU under :mod:`pipelines.cluster.node` (the container's main
    process, which passes the kubelet's SIGTERM on to each)."""
    options = ["$(DASK_SCHEDULER_ADDRESS)", "--name", "$(DASK_WORKER_NAME)",
               "--nthreads", str(opts.threads), "--resources", f"{worker_class}=1",
               "--preload", PRELOAD, "--dashboard-address", f":{WORKER_DASHBOARD_PORT}",
               *_tls_args(opts)]
    if opts.gpus_per_worker > 1:
        return ["python", "-m", "pipelines.cluster.node", "--workers",
                str(opts.gpus_per_worker), "--", *options]
    return ["dask", "worker", *options, "--no-nanny"]


def _worker_container(opts: KubeOptions, worker_class: str) -> dict:
    threads = str(opts.threads)
    cpus = str(opts.threads * max(1, opts.gpus_per_worker))   # each GPU's worker its threads
    env = {"DASK_SCHEDULER_ADDRESS": opts.scheduler_address,   # the operator's would be tcp://
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           ENV["clouds"]: opts.spot_nodes.cloud, **opts.plugin_env}
    limits: dict = {GPU_RESOURCE: opts.gpus_per_worker} if opts.gpus_per_worker else {}
    requests: dict = {"cpu": cpus}
    if opts.memory:
        limits["memory"] = requests["memory"] = opts.memory
    container = {"name": "worker", "image": opts.image, "imagePullPolicy": "IfNotPresent",
                 "args": worker_args(opts, worker_class), "env": _env(env),
                 "resources": {"requests": requests, **({"limits": limits} if limits else {})},
                 "ports": [{"name": "http-dashboard", "containerPort": WORKER_DASHBOARD_PORT,
                            "protocol": "TCP"}]}   # the first worker's (the others: +1, +2...)
    if opts.env_secret:
        container["envFrom"] = [{"secretRef": {"name": opts.env_secret}}]
    if opts.tls_secret:
        container["volumeMounts"] = [{"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}]
    return container


def worker_pod(opts: KubeOptions, worker_class: str) -> dict:
    """The pod spec of one worker class: spot pods on spot nodes, gpu pods never there."""
    nodes = opts.spot_nodes
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] \
        if opts.gpus_per_worker else []
    pod: dict = {"containers": [_worker_container(opts, worker_class)], **_tls_volume(opts)}
    if worker_class == SPOT:
        pod["nodeSelector"] = {nodes.label: nodes.value}
        tolerations.append({"key": nodes.label, "operator": "Equal", "value": nodes.value,
                            "effect": "NoSchedule"})
        pod["terminationGracePeriodSeconds"] = opts.grace_s
    else:   # NotIn also matches nodes without the label: every on-demand node
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": nodes.label, "operator": "NotIn", "values": [nodes.value]}]}]}}}
    if tolerations:
        pod["tolerations"] = tolerations
    return pod


def _worker_group(opts: KubeOptions, worker_class: str, replicas: int) -> dict:
    return {"replicas": replicas,
            "metadata": {"labels": {"spotlight/worker-class": worker_class}},
            "spec": worker_pod(opts, worker_class)}


def scheduler_args(opts: KubeOptions) -> list[str]:
    protocol = ["--protocol", "tls"] if opts.tls_secret else []
    return ["dask", "scheduler", "--port", str(SCHEDULER_PORT),
            "--dashboard-address", f":{DASHBOARD_PORT}", "--preload", SPOTLIGHT_PAGE,
            *protocol, *_tls_args(opts)]


def _scheduler(opts: KubeOptions) -> dict:
    def probe(delay_s: int, period_s: int) -> dict:
        return {"httpGet": {"port": "http-dashboard", "path": "/health"},
                "initialDelaySeconds": delay_s, "periodSeconds": period_s}

    container = {"name": "scheduler", "image": opts.image, "imagePullPolicy": "IfNotPresent",
                 "args": scheduler_args(opts),
                 "ports": [{"name": "tcp-comm", "containerPort": SCHEDULER_PORT, "protocol": "TCP"},
                           {"name": "http-dashboard", "containerPort": DASHBOARD_PORT,
                            "protocol": "TCP"}],
                 "readinessProbe": probe(5, 10), "livenessProbe": probe(15, 20),
                 "resources": {"requests": {"cpu": "1"}}}
    if opts.tls_secret:
        container["volumeMounts"] = [{"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}]
    service = {"type": "ClusterIP",
               "selector": {"dask.org/cluster-name": opts.name, "dask.org/component": "scheduler"},
               "ports": [{"name": "tcp-comm", "protocol": "TCP", "port": SCHEDULER_PORT,
                          "targetPort": "tcp-comm"},
                         {"name": "http-dashboard", "protocol": "TCP", "port": DASHBOARD_PORT,
                          "targetPort": "http-dashboard"}]}
    return {"spec": {"containers": [container], **_tls_volume(opts)}, "service": service}


def manifests(opts: KubeOptions) -> list[dict]:
    """[DaskCluster (scheduler + the gpu workers), DaskWorkerGroup (the spot workers)]."""
    labels = {"app.kubernetes.io/part-of": "spotlight"}
    cluster = {"apiVersion": API_VERSION, "kind": "DaskCluster",
               "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": labels},
               "spec": {"worker": _worker_group(opts, GPU, opts.gpu_workers),
                        "scheduler": _scheduler(opts)}}
    spot = {"apiVersion": API_VERSION, "kind": "DaskWorkerGroup",
            "metadata": {"name": opts.spot_group, "namespace": opts.namespace, "labels": labels},
            "spec": {"cluster": opts.name,
                     "worker": _worker_group(opts, SPOT, opts.spot_workers)}}
    return [cluster, spot]


def write_manifests(opts: KubeOptions, out_dir: str | Path) -> Path:
    """Write the manifests as one multi-document YAML file; returns its path."""
    path = Path(out_dir) / f"{opts.name}-cluster.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Spotlight on the dask-kubernetes operator ({PLUGIN_NAME} preload on every "
              f"worker).\n# Generated by `spotlight deploy kubernetes`; apply with "
              f"`kubectl apply -f {path.name}`.\n")
    path.write_text(header + yaml.dump_all(manifests(opts), Dumper=_PlainDumper, sort_keys=False))
    return path
