"""``spotlight deploy``: a cluster of gpu and spot workers for a run config, as files to apply.

``spotlight deploy kubernetes`` writes a DaskCluster and a DaskWorkerGroup for the
dask-kubernetes operator (:mod:`pipelines.deploy.kubernetes`); ``spotlight deploy slurm`` writes
one sbatch script per worker class (:mod:`pipelines.deploy.slurm`). Worker counts and threads
default to the config's ``cluster`` section, the certificates to the folder of its
``cluster.tls`` files; nothing is started or submitted: each command prints what to run next.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.cluster.cloud_class import CLOUDS, ENV
from pipelines.deploy.certificates import make_pki
from pipelines.deploy.kubernetes import PROVIDERS, KubeOptions, SpotNodes, write_manifests
from pipelines.deploy.slurm import TLS_FILES, SlurmOptions, scheduler_command, write_scripts
from pipelines.front.cli import UsageError, config_path
from spotlight.config import load_config, parse_override

# The repository's Dockerfile builds the CPU image; this build argument makes the CUDA one.
CUDA_BUILD_ARG = "TORCH_INDEX_URL=https://pypi.org/simple"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error")
    p.add_argument("--config", default=None, help="run config YAML (default configs/digits.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value, e.g. --set cluster.threads_per_worker=8")
    p.add_argument("--out", required=True, help="folder to write the files into")
    p.add_argument("--gpu-workers", type=int, default=None,
                   help="on-demand workers (default: cluster.gpu_workers)")
    p.add_argument("--spot-workers", type=int, default=None,
                   help="spot workers (default: cluster.spot_workers)")
    p.add_argument("--gpus-per-worker", type=int, default=1,
                   help="GPUs each worker asks for (default 1; 0 for CPU workers)")
    p.add_argument("--memory", default=None, help="memory of each worker, e.g. 64Gi / 64GB")
    p.add_argument("--tls-dir", default=None,
                   help=f"folder of the CA and node certificate ({', '.join(TLS_FILES)}; "
                        "`spotlight deploy certificates` writes them); default: the folder of "
                        "the config's cluster.tls.ca_file")
    p.add_argument("--no-tls", action="store_true",
                   help="no TLS (Dask's RPC is unauthenticated: a private test network only)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="target", required=True,
                           metavar="{kubernetes,slurm,certificates}")
    k = sub.add_parser("kubernetes", help="DaskCluster + DaskWorkerGroup for the "
                                          "dask-kubernetes operator (gpu and spot groups)")
    _common(k)
    k.add_argument("--provider", choices=sorted(PROVIDERS),
                   help="how your spot nodes are labelled: GKE Spot, EKS managed node groups, "
                        "Karpenter or AKS spot pools (or give --spot-node-label)")
    k.add_argument("--spot-node-label", metavar="KEY=VALUE",
                   help="the label of your spot nodes; also tolerated as a NoSchedule taint")
    k.add_argument("--cloud", choices=(*CLOUDS, "none"), default=None,
                   help="metadata service the spot pods watch for a termination notice "
                        "(default: the --provider's)")
    k.add_argument("--image", default=None,
                   help="worker and scheduler image (default spotlight:cuda, spotlight:cpu "
                        "with --gpus-per-worker 0; built from the repository's Dockerfile)")
    k.add_argument("--name", default="spotlight", help="DaskCluster name (default spotlight)")
    k.add_argument("--namespace", default="default", help="namespace (default default)")
    k.add_argument("--tls-secret", default=None,
                   help="secret holding ca.pem, node.pem, node.key (default NAME-tls)")
    k.add_argument("--env-secret", default="",
                   help="secret of environment variables for the workers (AWS_* of the store)")
    s = sub.add_parser("slurm", help="sbatch scripts: gpu workers on an on-demand partition, "
                                     "spot workers on a preemptible one")
    _common(s)
    s.add_argument("--scheduler", default=None,
                   help="address the workers join, tls://HOST:PORT (default: cluster.scheduler)")
    s.add_argument("--gpu-partition", default="gpu", help="on-demand partition (default gpu)")
    s.add_argument("--spot-partition", default="preemptible",
                   help="preemptible partition (default preemptible)")
    s.add_argument("--cpus", type=int, default=0, help="CPUs per job (default: the threads)")
    s.add_argument("--walltime", default="24:00:00", help="time limit (default 24:00:00)")
    s.add_argument("--account", default="", help="SLURM account (-A)")
    s.add_argument("--python", default=None,
                   help="the nodes' Python with Spotlight installed (default: this one)")
    s.add_argument("--log-dir", default="",
                   help="folder of the jobs' output; it must exist (default: OUT/logs, made)")
    s.add_argument("--cloud", choices=CLOUDS, default=None,
                   help="SLURM in a cloud: also watch this metadata service for notices")
    s.add_argument("--prologue", action="append", default=[], metavar="LINE",
                   help="shell line before the worker starts, e.g. 'source venv/bin/activate'")
    s.add_argument("--sbatch", action="append", default=[], metavar="DIRECTIVE",
                   help="extra #SBATCH directive for both classes: --sbatch qos=low writes "
                        "'#SBATCH --qos=low'")
    c = sub.add_parser("certificates", help="a CA and node and client certificates for a "
                                            "cluster that spans hosts (TLS)")
    c.add_argument("--out", required=True, help="folder to write them into (made if absent)")
    c.add_argument("--host", action="append", default=[], metavar="ADDR",
                   help="an address (IP or DNS name) the scheduler or a worker is reached at; "
                        "repeat for each host (localhost is always included)")
    c.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.target == "certificates":
        return _certificates(args)
    overrides = dict(parse_override(item) for item in (args.set or []))
    config = load_config(config_path(args), overrides)
    if args.target == "kubernetes":
        return _kubernetes(args, config)
    return _slurm(args, config)


def _certificates(args: argparse.Namespace) -> int:
    if args.days < 1:
        raise UsageError(f"--days {args.days}: certificates must be valid for at least a day")
    pki = make_pki(args.out, args.host, days=args.days)
    print(f"wrote ca.pem, node.pem/.key and client.pem/.key to {args.out} (valid {args.days} "
          f"days, for localhost{''.join(', ' + h for h in args.host)})")
    print("scheduler and workers: " + " ".join(pki.dask_args()))
    print("the driver's run config: " + ", ".join(f"{k}={v}" for k, v in
                                                  pki.run_settings().items()))
    return 0


def _tls_dir(args: argparse.Namespace, config) -> str | None:
    """The folder of the node certificates; "" without TLS, None when none is known."""
    tls = config.cluster.tls
    if args.no_tls:
        if tls.enabled:
            raise UsageError("--no-tls, but the run config sets cluster.tls: the driver would "
                             "speak TLS to a cluster without it; drop --no-tls or the "
                             "config's cluster.tls")
        return ""
    if not args.tls_dir and not tls.enabled:
        return None
    folder = Path(args.tls_dir or tls.ca_file).resolve()
    folder = folder if args.tls_dir else folder.parent
    missing = [name for name in TLS_FILES if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"{'--tls-dir' if args.tls_dir else 'the folder of cluster.tls.ca_file'} "
                         f"{folder} lacks {', '.join(missing)}: the scheduler and workers need "
                         "the CA and a node certificate (`spotlight deploy certificates --out DIR "
                         "--host ADDR` writes ca.pem, node.pem, node.key); give --tls-dir")
    return str(folder)


def _counts(args: argparse.Namespace, config) -> tuple[int, int]:
    gpu = config.cluster.gpu_workers if args.gpu_workers is None else args.gpu_workers
    spot = config.cluster.spot_workers if args.spot_workers is None else args.spot_workers
    return gpu, spot


def _spot_nodes(args: argparse.Namespace) -> SpotNodes:
    if args.spot_node_label:
        key, sep, value = args.spot_node_label.partition("=")
        if not (sep and key and value):
            raise UsageError(f"--spot-node-label {args.spot_node_label!r}: expected KEY=VALUE, "
                             "e.g. node.example.com/capacity=spot")
        base = PROVIDERS[args.provider].cloud if args.provider else "none"
        return SpotNodes(args.cloud or base, key, value)
    if not args.provider:
        raise UsageError(f"where are your spot nodes? give --provider "
                         f"({', '.join(sorted(PROVIDERS))}) or --spot-node-label KEY=VALUE")
    nodes = PROVIDERS[args.provider]
    return SpotNodes(args.cloud, nodes.label, nodes.value) if args.cloud else nodes


def _plugin_env(config) -> dict[str, str]:
    """The notice settings of the run config, for the workers' cloud metadata plugin."""
    p = config.preemption
    urls = {ENV["aws_url"]: p.aws_url, ENV["gcp_url"]: p.gcp_url, ENV["azure_url"]: p.azure_url}
    return {**{k: v for k, v in urls.items() if v}, ENV["notice_poll_s"]: f"{p.notice_poll_s:g}"}


def _driver_line(args: argparse.Namespace, config, scheduler: str, tls_dir: str | None) -> str:
    line = f"spotlight run --config {config_path(args)} --scheduler {scheduler} --store URL"
    if scheduler.startswith("tls://") and not config.cluster.tls.enabled:
        folder = tls_dir or "DIR"   # the client certificate beside the node's (make_pki)
        line += (f" \\\n      --set cluster.tls.ca_file={folder}/ca.pem --set "
                 f"cluster.tls.cert={folder}/client.pem --set cluster.tls.key={folder}/client.key")
    return line


def _kubernetes(args: argparse.Namespace, config) -> int:
    gpu, spot = _counts(args, config)
    tls_dir = _tls_dir(args, config)
    image = args.image or ("spotlight:cuda" if args.gpus_per_worker else "spotlight:cpu")
    try:
        opts = KubeOptions(
            image=image, spot_nodes=_spot_nodes(args), gpu_workers=gpu, spot_workers=spot,
            threads=config.cluster.threads_per_worker, gpus_per_worker=args.gpus_per_worker,
            name=args.name, namespace=args.namespace, memory=args.memory or "",
            tls_secret="" if tls_dir == "" else (args.tls_secret or f"{args.name}-tls"),
            env_secret=args.env_secret, plugin_env=_plugin_env(config))
    except ValueError as e:
        raise UsageError(str(e)) from None
    path = write_manifests(opts, args.out)
    ns = f"-n {opts.namespace} "
    print(f"wrote {path}: DaskCluster {opts.name} ({gpu} gpu workers, on-demand nodes) and "
          f"DaskWorkerGroup {opts.spot_group} ({spot} spot workers, "
          f"{opts.spot_nodes.label}={opts.spot_nodes.value})")
    print("next:")
    build_arg = f"--build-arg {CUDA_BUILD_ARG} " if args.gpus_per_worker else ""
    print(f"  docker build {build_arg}-t {image} . && docker push {image}   "
          "# to a registry the cluster pulls from")
    if opts.tls_secret:
        folder = tls_dir or "DIR"
        files = " ".join(f"--from-file={folder}/{name}" for name in TLS_FILES)
        print(f"  kubectl {ns}create secret generic {opts.tls_secret} {files}")
    print(f"  kubectl {ns}apply -f {path}   # needs the dask-kubernetes operator installed")
    print(f"  driver in the cluster: {_driver_line(args, config, opts.scheduler_address, tls_dir)}")
    print(f"  driver outside: kubectl {ns}port-forward svc/{opts.name}-scheduler 8786 and "
          "--scheduler " + opts.scheduler_address.split("://")[0] + "://localhost:8786")
    _sigterm_note(config)
    return 0


def _slurm(args: argparse.Namespace, config) -> int:
    gpu, spot = _counts(args, config)
    tls_dir = _tls_dir(args, config)
    if tls_dir is None:
        raise UsageError("the workers need the CA and a node certificate on the shared file "
                         "system: give --tls-dir DIR (ca.pem, node.pem, node.key; "
                         "`spotlight deploy certificates` writes them), or --no-tls")
    scheduler = args.scheduler or config.cluster.scheduler
    if not scheduler:
        raise UsageError("give --scheduler tls://HOST:8786 (the host where you start the "
                         "scheduler; the compute nodes must reach it) or set cluster.scheduler")
    try:
        opts = SlurmOptions(
            scheduler=scheduler, gpu_workers=gpu, spot_workers=spot,
            threads=config.cluster.threads_per_worker, gpu_partition=args.gpu_partition,
            spot_partition=args.spot_partition, gpus_per_worker=args.gpus_per_worker,
            cpus=args.cpus, memory=args.memory or "64GB", walltime=args.walltime,
            account=args.account, tls_dir=tls_dir, log_dir=args.log_dir, clouds=args.cloud or "",
            prologue=tuple(args.prologue),
            directives=tuple(d if d.startswith("-") else f"--{d}" for d in args.sbatch),
            **({"python": args.python} if args.python else {}))
        written = write_scripts(opts, args.out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for worker_class, path in written.items():
        print(f"wrote {path}: {opts.workers(worker_class)} {worker_class} workers on partition "
              f"{opts.partition(worker_class)}")
    print("next:")
    print(f"  on the scheduler's host: {scheduler_command(opts)}")
    print("  " + " && ".join(f"sbatch {path}" for path in written.values()))
    print(f"  {_driver_line(args, config, scheduler, tls_dir)}")
    _sigterm_note(config)
    return 0


def _sigterm_note(config) -> None:
    if "sigterm" not in config.preemption.notice_sources:
        print("note: preemption.notice_sources lacks 'sigterm': a spot worker will not hand "
              "its requests back when its pod or job is terminated")
