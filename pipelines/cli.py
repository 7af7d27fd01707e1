"""The ``spotlight`` command line: a thin layer over the importable API."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spotlight.config import ConfigError, load_config, parse_override

DEFAULT_CONFIG = "configs/digits.yaml"


def _config(args: argparse.Namespace):
    overrides = dict(parse_override(item) for item in (args.set or []))
    return load_config(args.config, overrides)


def cmd_pretrain(args: argparse.Namespace) -> int:
    from spotlight.models.pretrain import pretrain

    config = _config(args)
    result = pretrain(config, force=args.force)
    state = "cached" if result.cached else f"trained {result.steps} steps in {result.wall_s:.0f}s"
    print(f"base model ({state}, loss {result.final_loss:.4f}): {result.directory}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    config = _config(args)
    run_demo(config, iterations=args.iterations, report_dir=Path(args.report), store=args.store)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.cluster import ClusterError
    from pipelines.console import ConsoleProgress
    from pipelines.session import Session
    from storage import StorageError

    progress = ConsoleProgress()
    try:
        if args.resume:
            session = Session.resume(args.resume, scheduler=args.scheduler, on_event=progress)
        else:
            overrides = dict(parse_override(item) for item in (args.set or []))
            if args.scheduler:
                overrides["cluster.scheduler"] = args.scheduler
            if args.iterations is not None:
                overrides["iterations"] = args.iterations
            overrides.update(_preemption_overrides(args))
            session = Session.from_config(args.config, store=args.store, overrides=overrides,
                                          mode=args.mode, on_event=progress, progress=True)
    except (ClusterError, StorageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with session:
        print(f"run: {session.url}  mode: {session.mode}")
        print(f"dashboard: {session.dashboard_link or 'not available'}", flush=True)
        goal = args.iterations if args.iterations is not None else session.config.iterations
        remaining = max(goal - session.completed_iterations(), 0)
        if args.resume:
            print(f"resuming after iteration {session.completed_iterations() - 1}; "
                  f"{remaining} to go", flush=True)
        history = session.run(remaining)
        if len(history):
            last = history.iloc[-1]
            print(f"done: {len(history)} iterations, base val {session.base_val_reward:.3f}, "
                  f"last val {history['val_reward'].dropna().iloc[-1]:.3f}, "
                  f"cost ${last['cost_total_usd']:.4f}; resume or audit with: "
                  f"spotlight audit {session.url}")
    return 0


def _time_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"--time-scale {text!r}: must be a number > 0 (wall seconds per trace second; "
            "0.01 replays a 5-minute trace tick in 3 s)")
    return value


def _preemption_overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.preempt_trace:
        if not Path(args.preempt_trace).is_file():
            raise ConfigError(f"--preempt-trace {args.preempt_trace!r}: no such file; pass a count "
                              "JSON or an event CSV (see the spot traces README)")
        out["injector.trace"] = args.preempt_trace
    if args.time_scale is not None:
        out["injector.time_scale"] = args.time_scale
    if args.preempt_rate is not None:
        out["injector.poisson_rate_per_hour"] = args.preempt_rate
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    from pipelines.bench import BENCHES, load_benches, write_result

    load_benches()
    if args.name not in BENCHES:
        print(f"error: unknown benchmark {args.name!r}; choose one of {sorted(BENCHES)}", file=sys.stderr)
        return 2
    options = {"quick": args.quick, "task": args.task, "config": args.config, "json_path": args.json}
    if args.time_budget is not None:
        options["time_budget_s"] = args.time_budget
    if args.target is not None:
        options["target"] = args.target
    if args.seeds is not None:
        options["seeds"] = args.seeds
    if args.trace is not None:
        options["trace"] = args.trace
    if args.time_scale is not None:
        options["time_scale"] = args.time_scale
    if args.set or args.modes:
        if args.name != "convergence":
            print("error: --set and --modes apply to 'bench convergence' only; the other "
                  "benchmarks measure their documented settings", file=sys.stderr)
            return 2
        options["overrides"] = dict(parse_override(item) for item in (args.set or []))
        if args.modes:
            options["modes"] = [m.strip() for m in args.modes.split(",") if m.strip()]
    result = BENCHES[args.name](**options)
    print(write_result(result, args.json))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from pipelines.audit import audit_table, decoder_for_run, format_events, request_strip
    from storage import RunStore, StorageConfig, StorageError

    if (args.iteration is None) != (args.request is None):
        print("error: --iteration and --request go together (one request's strip)", file=sys.stderr)
        return 2
    if args.iteration is None and (args.stage or args.png):
        print("error: --stage and --png need --iteration K --request R", file=sys.stderr)
        return 2
    try:
        config = StorageConfig(url=args.run_url, endpoint_url=args.endpoint_url)
        # Reading must create nothing: the local probe would make a missing directory.
        store = RunStore.open(config, create=False, check_on_open=config.scheme != "file")
        print(audit_table(store))
        if args.events:
            print(format_events(store.read_events()))
        if args.iteration is not None:
            png = args.png or f"audit-iter{args.iteration}-{args.request}.png"
            request_strip(store, args.iteration, args.request, png, decode=decoder_for_run(store),
                          stage=args.stage)
            print(f"strip: {png}")
    except StorageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotlight", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser, default: str | None = DEFAULT_CONFIG) -> None:
        p.add_argument("--config", default=default, help=f"run config YAML (default {default})")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set grpo.lr=3e-4 (repeatable)")

    p = sub.add_parser("pretrain", help="train (or load from cache) the base model of a config")
    with_config(p)
    p.add_argument("--force", action="store_true", help="retrain even if a cached model exists")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("demo", help="pretrain (cached), run a few iterations on an embedded Dask "
                                    "cluster, write a report")
    with_config(p)
    p.add_argument("--iterations", type=int, default=None, help="RL iterations (default: config)")
    p.add_argument("--report", default="reports/demo", help="report folder (default reports/demo)")
    p.add_argument("--store", default=None, help="run store URL (default runs/<time>-<hash>)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="run RL iterations on a Dask cluster (embedded by default)")
    with_config(p)
    p.add_argument("--iterations", type=int, default=None, help="iterations (default: config)")
    p.add_argument("--store", default=None, help="run store URL (default runs/<time>-<hash>)")
    p.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="existing scheduler, e.g. tcp://10.0.0.5:8786 (default: embedded cluster)")
    p.add_argument("--resume", metavar="RUN_URL", default=None,
                   help="continue the run stored at RUN_URL after its last completed stage")
    p.add_argument("--mode", choices=("spotlight", "vanilla", "sync"), default=None,
                   help="spotlight (stale exploration on spot), sync, or vanilla (default: config)")
    p.add_argument("--preempt-trace", metavar="PATH", default=None,
                   help="replay a spot trace (count JSON or event CSV) against the embedded "
                        "cluster's spot workers: real SIGKILLs / notices, new workers on rises")
    p.add_argument("--time-scale", type=_time_scale, default=None, metavar="X",
                   help="wall seconds per trace second (default 1; 0.01 = 100x faster)")
    p.add_argument("--preempt-rate", type=float, default=None, metavar="PER_HOUR",
                   help="without a trace: Poisson preemptions per spot worker-hour")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="run a benchmark and write its JSON")
    p.add_argument("name", help="benchmark name, e.g. learning")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--quick", action="store_true", help="a small, fast version (smoke check)")
    p.add_argument("--task", default="ocr", help="task family: ocr or geneval")
    p.add_argument("--config", default=None, help="config YAML (default: the task's)")
    p.add_argument("--time-budget", type=float, default=None, help="wall budget in seconds")
    p.add_argument("--target", type=float, default=None,
                   help="convergence: target validation reward (default: base + 0.05)")
    p.add_argument("--seeds", type=int, default=None, metavar="K",
                   help="convergence: run every mode under K run seeds; report medians")
    p.add_argument("--modes", default=None, metavar="M1,M2",
                   help="convergence: the modes to run (default: vanilla,sync,spotlight)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="convergence: override a config value for every mode (repeatable)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="preemption: spot trace to replay (default: the shipped g4dn events)")
    p.add_argument("--time-scale", type=_time_scale, default=None, metavar="X",
                   help="preemption: wall seconds per trace second (default: drops about "
                        "8 s apart)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("audit", help="print a run's per-iteration audit table from its store; "
                                     "with --iteration/--request, write one request's PNG strip")
    p.add_argument("run_url", help="run URL: a path, file://PATH or s3://BUCKET/PREFIX")
    p.add_argument("--iteration", type=int, metavar="K", help="iteration of the request to draw")
    p.add_argument("--request", metavar="R", help="request id to draw (every committed step)")
    p.add_argument("--stage", help="explore, rollout or validation (default: the first stage of "
                                   "the iteration that holds the request)")
    p.add_argument("--png", metavar="PATH",
                   help="where to write the strip (default audit-iterK-R.png here)")
    p.add_argument("--events", action="store_true",
                   help="also print the event log: injections, worker losses, notices, every "
                        "request assignment, requeue and hand-back")
    p.add_argument("--endpoint-url", default=None,
                   help="S3 endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL); "
                        "credentials come from the standard AWS environment variables")
    p.set_defaults(func=cmd_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
