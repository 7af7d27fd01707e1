"""`spotlight deploy kubernetes`: the manifests' structure, checked without a cluster against
the operator's CRDs (DaskCluster / DaskWorkerGroup, kubernetes.dask.org/v1) and against the
real `dask worker` / `dask scheduler` command lines."""
from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest
import yaml

from pipelines.cluster.node import worker_command
from pipelines.deploy.kubernetes import (
    API_VERSION,
    PRELOAD,
    TLS_FILES,
    TLS_MOUNT,
    KubeOptions,
    SpotNodes,
    manifests,
    write_manifests,
)
from tests.deploy.conftest import scheduler_options, worker_options


def _load(path: Path) -> list[dict]:
    return list(yaml.safe_load_all(path.read_text()))


def _container(group: dict) -> dict:
    (container,) = group["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def _mounted(args: list[str], folder: Path) -> list[str]:
    """``args`` with the secret's mount point replaced by a folder that holds the files."""
    return [a.replace(TLS_MOUNT, str(folder)) for a in args]


@pytest.fixture
def generated(tmp_path, pki, tls_settings, spotlight):
    code, out, err = spotlight(
        "deploy", "kubernetes", "--out", str(tmp_path / "k8s"), "--provider", "eks",
        "--image", "registry.example/spotlight:cuda", "--set", "cluster.gpu_workers=2",
        "--set", "cluster.spot_workers=5", "--set", "cluster.threads_per_worker=4",
        "--set", "preemption.gcp_url=http://127.0.0.1:9/computeMetadata/v1/instance/preempted",
        *tls_settings)
    assert code == 0, err
    (path,) = (tmp_path / "k8s").glob("*.yaml")
    return _load(path), path, out


def test_one_daskcluster_and_one_spot_worker_group_per_the_operators_crds(generated):
    (cluster, spot), _, _ = generated
    assert (cluster["apiVersion"], cluster["kind"]) == (API_VERSION, "DaskCluster")
    assert (spot["apiVersion"], spot["kind"]) == (API_VERSION, "DaskWorkerGroup")
    # the CRDs' required fields: a cluster's scheduler (pod spec + service) and default worker
    # group; a worker group's cluster and worker pod spec
    assert {"scheduler", "worker"} <= set(cluster["spec"])
    assert {"spec", "service"} <= set(cluster["spec"]["scheduler"])
    assert spot["spec"]["cluster"] == cluster["metadata"]["name"] == "spotlight"
    for group in (cluster["spec"]["worker"], spot["spec"]["worker"],
                  cluster["spec"]["scheduler"]):
        assert all({"name", "image"} <= set(c) for c in group["spec"]["containers"])
    assert cluster["spec"]["worker"]["replicas"] == 2   # cluster.gpu_workers
    assert spot["spec"]["worker"]["replicas"] == 5      # cluster.spot_workers


def test_each_group_is_its_worker_class_on_its_own_nodes(generated):
    (cluster, spot), _, _ = generated
    gpu_pod, spot_pod = cluster["spec"]["worker"]["spec"], spot["spec"]["worker"]["spec"]
    label, value = "eks.amazonaws.com/capacityType", "SPOT"
    assert spot_pod["nodeSelector"] == {label: value}
    assert {"key": label, "operator": "Equal", "value": value, "effect": "NoSchedule"} in \
        spot_pod["tolerations"]
    (term,) = gpu_pod["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": label, "operator": "NotIn", "values": [value]}]
    assert "nodeSelector" not in gpu_pod and all(t["key"] != label for t in gpu_pod["tolerations"])
    assert spot_pod["terminationGracePeriodSeconds"] > 0
    for pod in (gpu_pod, spot_pod):
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["resources"]["requests"]["cpu"] == "4"


def test_worker_command_lines_parse_as_dask_worker_with_class_plugin_and_tls(generated, pki):
    (cluster, spot), _, _ = generated
    folder = Path(pki.ca_file).parent
    for group, worker_class in ((cluster["spec"]["worker"], "gpu"),
                                (spot["spec"]["worker"], "spot")):
        container = _container(group)
        assert container["args"][:2] == ["dask", "worker"]
        options = worker_options(_mounted(container["args"][2:], folder))
        assert options["resources"] == f"{worker_class}=1"
        assert options["preload"] == (PRELOAD,)
        assert options["nanny"] is False   # SIGTERM reaches the worker's preemption watch
        assert options["nthreads"] == 4
        assert [options["tls_ca_file"], options["tls_cert"], options["tls_key"]] == \
            [str(folder / name) for name in TLS_FILES]
        assert options["scheduler"] == "$(DASK_SCHEDULER_ADDRESS)"
        env = _env(container)
        assert env["DASK_SCHEDULER_ADDRESS"] == \
            "tls://spotlight-scheduler.default.svc.cluster.local:8786"
        assert env["OMP_NUM_THREADS"] == "4" and env["SPOTLIGHT_CLOUDS"] == "aws"   # EKS
        assert env["SPOTLIGHT_GCP_URL"].startswith("http://127.0.0.1:9/")   # preemption.gcp_url
        assert container["volumeMounts"] == [{"name": "tls", "mountPath": TLS_MOUNT,
                                              "readOnly": True}]
        assert group["spec"]["volumes"] == [{"name": "tls", "secret": {
            "secretName": "spotlight-tls", "defaultMode": 0o400}}]


def test_the_scheduler_speaks_tls_behind_the_operators_service(generated, pki):
    (cluster, _), _, _ = generated
    scheduler = cluster["spec"]["scheduler"]
    container = _container(scheduler)
    assert container["args"][:2] == ["dask", "scheduler"]
    options = scheduler_options(_mounted(container["args"][2:], Path(pki.ca_file).parent))
    assert (options["protocol"], int(options["port"])) == ("tls", 8786)
    assert options["preload"] == ("pipelines.observe.dashboard_page",)   # the Spotlight page
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    service = scheduler["service"]
    assert service["selector"] == {"dask.org/cluster-name": "spotlight",
                                   "dask.org/component": "scheduler"}
    assert {p["targetPort"] for p in service["ports"]} == set(ports)
    assert container["readinessProbe"]["httpGet"] == {"port": "http-dashboard", "path": "/health"}


def test_the_commands_are_the_images_real_entry_points():
    """`dask worker` / `dask scheduler` are subcommands distributed registers; the preload is a
    module with Dask's preload hook."""
    commands = {e.name for e in importlib.metadata.entry_points(group="dask_cli")}
    assert {"worker", "scheduler"} <= commands
    assert callable(importlib.import_module(PRELOAD).dask_setup)


def test_printed_next_steps_name_the_file_the_secret_and_the_driver(generated, pki):
    _, path, out = generated
    folder = Path(pki.ca_file).parent
    assert f"kubectl -n default apply -f {path}" in out
    assert ("kubectl -n default create secret generic spotlight-tls "
            + " ".join(f"--from-file={folder}/{name}" for name in TLS_FILES)) in out
    assert "--scheduler tls://spotlight-scheduler.default.svc.cluster.local:8786" in out


def test_a_custom_spot_label_and_no_tls(tmp_path):
    opts = KubeOptions(image="img", spot_nodes=SpotNodes("none", "pool", "cheap"),
                       gpus_per_worker=0, tls_secret="", name="run-7", namespace="ml")
    cluster, spot = manifests(opts)
    spot_pod = spot["spec"]["worker"]["spec"]
    assert spot_pod["nodeSelector"] == {"pool": "cheap"}
    assert spot_pod["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "cheap",
                                        "effect": "NoSchedule"}]   # no GPU toleration at 0 GPUs
    container = _container(spot["spec"]["worker"])
    assert "limits" not in container["resources"] and "volumeMounts" not in container
    assert not any(a.startswith("--tls") for a in container["args"])
    assert _env(container)["DASK_SCHEDULER_ADDRESS"] == \
        "tcp://run-7-scheduler.ml.svc.cluster.local:8786"
    assert "--protocol" not in _container(cluster["spec"]["scheduler"])["args"]
    assert _load(write_manifests(opts, tmp_path)) == [cluster, spot]


def test_a_pod_of_eight_gpus_runs_a_worker_per_gpu_under_the_node_launcher():
    """The container's main process is pipelines.cluster.node (it passes the kubelet's SIGTERM
    on to each worker); each worker it starts is a stock `dask worker` without a nanny, under a
    name and dashboard port of its own."""
    opts = KubeOptions(image="img", spot_nodes=SpotNodes("aws", "pool", "spot"), threads=2,
                       gpus_per_worker=8, tls_secret="")
    cluster, _ = manifests(opts)
    container = _container(cluster["spec"]["worker"])
    assert container["args"][:6] == ["python", "-m", "pipelines.cluster.node", "--workers", "8",
                                     "--"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["resources"]["requests"]["cpu"] == "16"   # 2 threads for each worker
    command = worker_command(container["args"][6:], 3)
    assert command[1:3] == ["-m", "distributed.cli.dask_worker"]
    options = worker_options(command[3:])
    assert options["nanny"] is False and options["nthreads"] == 2
    assert options["name"] == "$(DASK_WORKER_NAME)-3"
    assert options["dashboard_address"] == ":8791"   # 8788 + 3
    assert options["resources"] == "gpu=1" and options["preload"] == (PRELOAD,)


@pytest.mark.parametrize("argv,needle", [
    ([], "give --provider"),
    (["--provider", "gke", "--name", "Spotlight_1"], "--name 'Spotlight_1'"),
    (["--spot-node-label", "nolabel"], "--spot-node-label 'nolabel': expected KEY=VALUE"),
    (["--provider", "aks", "--gpu-workers", "0"], "0 gpu (>= 1 needed)"),
    (["--provider", "aks", "--tls-dir", "/nonexistent"], "lacks ca.pem, node.pem, node.key")])
def test_bad_options_are_usage_errors_that_say_what_to_give(tmp_path, spotlight, argv, needle):
    code, _, err = spotlight("deploy", "kubernetes", "--out", str(tmp_path), *argv)
    assert code == 2 and needle in err
    assert not list(tmp_path.iterdir())
