"""The ``spotlight`` command line: a thin layer over the importable API.

Every failure ends in one line on stderr and an exit code per class: 1 internal error (a bug;
--debug shows the traceback), 2 configuration or usage, 3 storage, 4 cluster, 5 a task failed
on a worker, 6 fenced (another driver took the run over), 130 interrupted (Ctrl-C; the run
store stays resumable)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from spotlight.config import ConfigError, load_config, parse_override
from spotlight.modes import MODE_NAMES

DEFAULT_CONFIG = "configs/digits.yaml"
# The demo's own default: the product's best settings and a steadier validation.
DEMO_CONFIG = "configs/digits-demo.yaml"


def config_path(args: argparse.Namespace, default: str = DEFAULT_CONFIG) -> str:
    """``--config``, or the shipped ``default`` (found from here or from the project root)."""
    if getattr(args, "config", None):
        return args.config
    if Path(default).is_file():
        return default
    from spotlight.config import PROJECT_ROOT

    return str(PROJECT_ROOT / default)


def _config(args: argparse.Namespace, default: str = DEFAULT_CONFIG):
    overrides = dict(parse_override(item) for item in (args.set or []))
    return load_config(config_path(args, default), overrides)


def cmd_pretrain(args: argparse.Namespace) -> int:
    from spotlight.models.pretrain import pretrain

    config = _config(args)
    result = pretrain(config, force=args.force)
    state = "cached" if result.cached else f"trained {result.steps} steps in {result.wall_s:.0f}s"
    print(f"base model ({state}, loss {result.final_loss:.4f}): {result.directory}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.front.demo import run_demo

    config = _config(args, DEMO_CONFIG)
    run_demo(config, iterations=args.iterations, report_dir=Path(args.report), store=args.store)
    return 0


# Options that change what a stored run computes; ``--resume`` refuses them. Safe with it:
# --iterations (extends or shortens the run), --scheduler (another cluster; placement only).
CHANGES_THE_RUN = ("config", "set", "mode", "store", "preempt_trace", "time_scale",
                   "preempt_rate")


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.front.console import ConsoleProgress, dashboard_line, dask_log_line

    if args.dry_run:
        return _dry_run(args)
    progress = ConsoleProgress()
    if args.resume:
        given = [f"--{name.replace('_', '-')}" for name in CHANGES_THE_RUN
                 if getattr(args, name) not in (None, [])]
        if given:
            raise UsageError(f"--resume continues the run exactly as it was stored; "
                             f"{', '.join(given)} would change it. Start a new run instead "
                             "(without --resume), or leave those options out; --iterations "
                             "and --scheduler are allowed with --resume")
        session = _resumed(args, progress)
    else:
        if args.takeover or args.force:
            raise UsageError("--takeover and --force take over a stored run: use them with "
                             "--resume RUN_URL")
        overrides = dict(parse_override(item) for item in (args.set or []))
        if args.scheduler:
            overrides["cluster.scheduler"] = args.scheduler
        if args.iterations is not None:
            overrides["iterations"] = args.iterations
        overrides.update(_preemption_overrides(args))
        from pipelines.front.session import Session

        session = Session.from_config(config_path(args), store=args.store, overrides=overrides,
                                      mode=args.mode, on_event=progress, progress=True,
                                      store_options=_store_options(args))
    RUNNING["url"] = session.url
    with session:
        print(f"run: {session.url}  mode: {session.mode}")
        if dask_log_line(session):
            print(dask_log_line(session))
        print(dashboard_line(session), flush=True)
        goal = args.iterations if args.iterations is not None else session.config.iterations
        done = session.completed_iterations()
        remaining = max(goal - done, 0)
        if args.resume:
            where = f"after iteration {done - 1}" if done else "within its first iteration"
            print(f"resuming {session.url} {where} (weights version "
                  f"{session.store.latest_checkpoint()}); {remaining} to go", flush=True)
        history = session.run(remaining)
        if len(history):
            last = history.iloc[-1]
            vals = history["val_reward"].dropna()
            last_val = f"{vals.iloc[-1]:.3f}" if len(vals) else "-"
            print(f"done: {len(history)} iterations, validation reward: base "
                  f"{session.base_val_reward:.3f}, last {last_val}; "
                  f"cost ${last['cost_total_usd']:.4f}; audit with: "
                  f"spotlight audit {session.url}")
    return 0


def _resumed(args: argparse.Namespace, progress):
    """The session of ``--resume``, its lease taken before the rest of Spotlight loads (torch
    and diffusers take seconds): a second driver is refused at once, having started nothing."""
    from storage import RunStore

    store = RunStore.open(args.resume, create=False, writer=True, **_store_options(args))
    lease = store.take_lease(takeover=args.takeover or args.force, force=args.force,
                             on_wait=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        from pipelines.front.session import Session
    except BaseException:   # Ctrl-C while it loads: the next driver need not wait it out
        lease.release()
        raise
    return Session.resume(store, scheduler=args.scheduler, on_event=progress)


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
    if args.preempt_trace:   # checked and parsed with the config, before anything is written
        out["injector.trace"] = args.preempt_trace
    if args.time_scale is not None:
        out["injector.time_scale"] = args.time_scale
    if args.preempt_rate is not None:
        out["injector.poisson_rate_per_hour"] = args.preempt_rate
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    from pipelines.bench.registry import OPTIONS, SPECS, benches_taking, load_bench, write_result

    spec = SPECS[args.name]
    # argparse names each option's attribute after its flag
    values = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in OPTIONS}
    given = {flag: value for flag, value in values.items() if value not in (None, False)}
    for flag in given:   # before the bench's imports: a refusal takes no time
        if flag not in spec.options:
            raise UsageError(f"{flag} applies to {_bench_list(benches_taking(flag))} only; 'bench "
                             f"{args.name}' takes {', '.join(spec.options) or 'no options'} "
                             "besides --quick and --json")
    options = {"quick": args.quick, "json_path": args.json}
    for flag, value in given.items():
        if flag == "--set":
            value = dict(parse_override(item) for item in value)
        elif flag in ("--modes", "--scenarios"):
            value = [name.strip() for name in value.split(",") if name.strip()]
        elif flag == "--run":
            value = list(value)
        elif flag == "--workers" and args.name != "scale":
            if len(value) > 1:
                raise UsageError(f"--workers takes one count for 'bench {args.name}' (several "
                                 "are for 'bench scale')")
            value = value[0]
        options[OPTIONS[flag]] = value
    result = load_bench(args.name)(**options)
    print(write_result(result, args.json))
    return 0


def _bench_list(names: list[str]) -> str:
    quoted = [f"'bench {names[0]}'"] + [f"'{name}'" for name in names[1:]]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"



def cmd_audit(args: argparse.Namespace) -> int:
    from pipelines.front.audit import audit_table, decoder_for_run, format_events, request_strip
    from storage import RunStore, StorageConfig

    if (args.iteration is None) != (args.request is None):
        print("error: --iteration and --request go together (one request's strip)", file=sys.stderr)
        return 2
    if args.iteration is None and (args.stage or args.png):
        print("error: --stage and --png need --iteration K --request R", file=sys.stderr)
        return 2
    config = StorageConfig(url=args.run_url, endpoint_url=args.endpoint_url)
    store = RunStore.open(config, create=False)   # reading creates nothing
    print(audit_table(store))
    if args.events:
        print(format_events(store.read_events()))
    if args.iteration is not None:
        png = args.png or f"audit-iter{args.iteration}-{args.request}.png"
        request_strip(store, args.iteration, args.request, png, decode=decoder_for_run(store),
                      stage=args.stage)
        print(f"strip: {png}")
    return 0


def _with_config(p: argparse.ArgumentParser, default: str = DEFAULT_CONFIG) -> None:
    p.add_argument("--config", default=None, help=f"run config YAML (default {default})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value, e.g. --set grpo.lr=3e-4 (repeatable)")


def _add_pretrain(p: argparse.ArgumentParser) -> None:
    _with_config(p)
    p.add_argument("--force", action="store_true", help="retrain even if a cached model exists")
    p.set_defaults(func=cmd_pretrain)


def _add_demo(p: argparse.ArgumentParser) -> None:
    _with_config(p, DEMO_CONFIG)
    p.add_argument("--iterations", type=int, default=None, help="RL iterations (default: config)")
    p.add_argument("--report", default="reports/demo", help="report folder (default reports/demo)")
    p.add_argument("--store", default=None, help="run store URL (default runs/<time>-<hash>)")
    p.set_defaults(func=cmd_demo)


def _dry_run(args: argparse.Namespace) -> int:
    """Print the sizing table; start nothing, write nothing."""
    from pipelines.front.dry_run import dry_run_report
    from spotlight.config import load_config

    if args.resume:
        raise UsageError("--dry-run sizes a new run from --config; it does not go with --resume")
    overrides = dict(parse_override(item) for item in (args.set or []))
    print(dry_run_report(load_config(config_path(args), overrides)))
    return 0


def _store_options(args: argparse.Namespace) -> dict:
    """Run-store settings from the command line (the rest come from the URL)."""
    options = {}
    if args.store_patience is not None:
        if args.store_patience < 0:
            raise UsageError(f"--store-patience {args.store_patience:g}: a number of seconds "
                             ">= 0 is expected (0: give up after the store's retries)")
        options["patience_s"] = args.store_patience
    if args.lease_ttl is not None:
        if not 1 <= args.lease_ttl <= 86400:
            raise UsageError(f"--lease-ttl {args.lease_ttl:g}: a number of seconds from 1 to "
                             "86400 is expected (it is renewed every third of it)")
        options["lease_ttl_s"] = args.lease_ttl
    return options


def _add_run(p: argparse.ArgumentParser) -> None:
    _with_config(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print memory per worker, time and cost per iteration; start nothing")
    p.add_argument("--iterations", type=int, default=None, help="iterations (default: config)")
    p.add_argument("--store", default=None, help="run store URL (default runs/<time>-<hash>)")
    p.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="existing scheduler, e.g. tls://10.0.0.5:8786 (tcp:// on one "
                        "machine; default: an embedded cluster)")
    p.add_argument("--resume", metavar="RUN_URL", default=None,
                   help="continue the run stored at RUN_URL after its last completed stage, "
                        "exactly as stored: only --iterations (extend or shorten it) and "
                        "--scheduler (another cluster) may go with it; --config, --set, --mode, "
                        "--store and --preempt-* are refused")
    p.add_argument("--store-patience", type=float, default=None, metavar="SECONDS",
                   help="how long the driver and its workers retry a run store that is away "
                        "(its host cut off, restarting) before the run stops, resumable "
                        "(default 60)")
    p.add_argument("--lease-ttl", type=float, default=None, metavar="SECONDS",
                   help="how long this driver's lease on the run outlives its last renewal: "
                        "after a crash, --takeover can take the run that much later (default "
                        "30; shorter means a faster takeover and more reads of the store)")
    p.add_argument("--takeover", action="store_true",
                   help="with --resume: take the run's lease from a driver that is gone (a "
                        "crash or a cut-off host): a lease still live is watched until it "
                        "expires unrenewed (at most --lease-ttl), one renewed meanwhile is "
                        "refused; that driver's writes are refused from then on")
    p.add_argument("--force", action="store_true",
                   help="with --resume --takeover: take the lease even while it is live (the "
                        "other driver still renews it); it stops at its next write")
    p.add_argument("--mode", choices=MODE_NAMES, default=None,
                   help="spotlight (stale exploration on spot), sync, vanilla, or rlboost "
                        "(rollouts on gpu and spot, no exploration) (default: config)")
    p.add_argument("--preempt-trace", metavar="PATH", default=None,
                   help="replay a spot trace (count JSON or event CSV) against the embedded "
                        "cluster's spot workers: real SIGKILLs / notices, new workers on rises")
    p.add_argument("--time-scale", type=_time_scale, default=None, metavar="X",
                   help="wall seconds per trace second (default 1; 0.01 = 100x faster)")
    p.add_argument("--preempt-rate", type=float, default=None, metavar="PER_HOUR",
                   help="without a trace: Poisson preemptions per spot worker-hour")
    p.set_defaults(func=cmd_run)


def _add_bench(p: argparse.ArgumentParser) -> None:
    from pipelines.bench.registry import SPECS, benches_taking, worker_counts

    p.description = "Benchmarks:\n" + "\n".join(
        f"  {name:14} {spec.answers}" for name, spec in SPECS.items())
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("name", choices=list(SPECS), metavar="NAME",
                   help=f"the benchmark: {', '.join(SPECS)}")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--quick", action="store_true", help="a small, fast version (smoke check)")

    def option(flag: str, help_text: str, **kwargs) -> None:
        p.add_argument(flag, help=f"{help_text} [{', '.join(benches_taking(flag))}]", **kwargs)

    option("--task", "task family: ocr or geneval (default ocr)", choices=("ocr", "geneval"))
    option("--config", "config YAML (default: the task's, or the bench's own)")
    option("--iterations", "iterations per run (fixed, whatever the machine's speed)", type=int,
           metavar="N")
    option("--seeds", "paired run seeds per mode (default 8); medians with 90%% bootstrap "
                      "intervals", type=int, metavar="K")
    option("--target", "target validation reward (default: the base's + 0.02 on OCR, + 0.05 "
                       "on GenEval)", type=float)
    option("--budget", "the fixed iteration budget the area under the curve and the value at "
                       "the budget are read at; a run stops once it has run B and reached the "
                       "target (default 10; --iterations caps the rest)", type=int, metavar="B")
    option("--workers", "convergence: harness runs at a time (default: 2, one core each); "
                        "sharded: worker processes (default 4); scale: worker counts "
                        "(default 8,64,256)", type=worker_counts, metavar="W[,W...]")
    option("--resume", "continue a cut-off bench from the runs saved beside --json "
                       "(PATH.parts/)", action="store_true")
    option("--modes", "the modes to run, of vanilla, sync, stale, spotlight, rlboost and "
                      "spotlight-xR (the planner on R times the spot capacity; default: "
                      "vanilla,sync,stale,spotlight), each also behind an objective: nft-MODE "
                      "(DiffusionNFT's forward-process objective), reuse-MODE (nft trained on "
                      "the explored samples, no rollout), reuse-cover-MODE (reuse with "
                      "planner.cover_candidates 12), awm-MODE and awm-reuse-MODE (the same "
                      "with Advantage Weighted Matching), fast-MODE (Flow-GRPO with a "
                      "two-step SDE window)", metavar="M1,M2")
    option("--product", "the mode the headline speedup_vs_vanilla reports (default: "
                        "spotlight)", metavar="MODE")
    option("--set", "override a config value (repeatable)", action="append",
           metavar="KEY=VALUE")
    option("--rounds", "rounds (overhead: of runs, each order reversed from the last, default "
                       "3; stock-workers: alternating rounds; sp: regroups measured, default 5)",
           type=int, metavar="R")
    option("--devices", "persistent executors (worker processes) to group, at least 4 "
                        "(default 4)", type=int, metavar="D")
    option("--trace", "spot trace to replay (default: the shipped g4dn events)", metavar="PATH")
    option("--run", "validate against this measured run (repeatable; default: run the digits "
                    "world on the embedded cluster first)", action="append", metavar="URL")
    option("--time-scale", "wall seconds per trace second (default: drops about 8 s apart)",
           type=_time_scale, metavar="X")
    option("--scenarios", "the scenarios to run -- preemption: of main (clean and chaos), "
                          "balance and sp (default: all; --quick: main); faults: of partition, "
                          "zombie, dual_driver, store_outage, driver_loss, cpu_hog, scheduler_loss "
                          "(default: all)", metavar="S1,S2")
    p.set_defaults(func=cmd_bench)


def _add_audit(p: argparse.ArgumentParser) -> None:
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


def _command_module(module: str):
    """A command whose options and code live in their own module (``add_arguments(p)`` sets
    ``func``); imported when the parser is built, so such a module keeps heavy imports inside
    its ``run``."""
    def add(p: argparse.ArgumentParser) -> None:
        import importlib

        importlib.import_module(module).add_arguments(p)
    return add


COMMANDS = (
    ("pretrain", "train (or load from cache) the base model of a config", _add_pretrain),
    ("demo", "pretrain (cached), run a few iterations on an embedded Dask cluster, write a "
             "report", _add_demo),
    ("run", "run RL iterations on a Dask cluster (embedded by default)", _add_run),
    ("bench", "run a benchmark and write its JSON", _add_bench),
    ("audit", "print a run's per-iteration audit table from its store; with "
              "--iteration/--request, write one request's PNG strip", _add_audit),
    ("report", "write one self-contained HTML report of a run (finished or running) from its "
               "store", _command_module("pipelines.front.html_report")),
    ("deploy", "generate deployment specs (Kubernetes, SLURM) from a run config",
     _command_module("pipelines.deploy.cli")),
    ("serve-reward", "serve a reward (OCR, GenEval) over HTTP for runs on other machines",
     _command_module("pipelines.front.reward_server")),
    ("check-gpu", "measure a rollout and a training step at real size against the sizing "
                  "model, and run the pipeline on CUDA",
     _command_module("pipelines.front.check_gpu")),
)


def build_parser() -> argparse.ArgumentParser:
    debug = "show the traceback of an error (otherwise one line and an exit code)"
    parser = argparse.ArgumentParser(prog="spotlight", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help=debug)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, add in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        # SUPPRESS: `spotlight --debug run` must not be reset by the command's own default
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug)
        add(p)
    return parser


class UsageError(ValueError):
    """Options that do not go together; the message says which and what to do."""


# One exit code per class of failure (README: Exit codes).
EXIT_OK, EXIT_INTERNAL, EXIT_CONFIG, EXIT_STORAGE, EXIT_CLUSTER, EXIT_TASK = 0, 1, 2, 3, 4, 5
EXIT_FENCED, EXIT_INTERRUPTED = 6, 130
RUNNING: dict = {}   # the run this process works on, for the resume hint


def _classify(err: BaseException) -> tuple[int, str]:
    """The exit code and the one line a user reads for ``err``."""
    from pipelines.cluster import ClusterError, RunInterrupted, TaskFailedError
    from pipelines.cluster.connect import scheduler_connection_closed
    from storage import StorageError
    from storage.errors import DriverFenced

    if isinstance(err, DriverFenced):
        return EXIT_FENCED, f"fenced: {err}"
    if isinstance(err, (KeyboardInterrupt, RunInterrupted)):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(err, StorageError):
        return EXIT_STORAGE, f"storage: {err}"
    if isinstance(err, ClusterError):
        return EXIT_CLUSTER, f"cluster: {err}"
    if scheduler_connection_closed(err):
        return EXIT_CLUSTER, (f"cluster: the connection to the scheduler closed ({err}); what "
                              "was committed stays: start a scheduler and its workers, then "
                              "`spotlight run --resume RUN_URL --scheduler NEW_ADDRESS`")
    if isinstance(err, TaskFailedError):
        return EXIT_TASK, f"task: {err}"
    if isinstance(err, (ConfigError, UsageError)):
        return EXIT_CONFIG, str(err)
    if isinstance(err, OSError) and not isinstance(err, (ConnectionError, TimeoutError)):
        return EXIT_STORAGE, (f"file system: {err}. Check the path, its permissions and free "
                              "space; what was committed before is intact")
    if isinstance(err, (ValueError, FileNotFoundError)):
        return EXIT_CONFIG, str(err)
    return EXIT_INTERNAL, (f"internal error: {type(err).__name__}: {err}. This is a bug in "
                           "Spotlight; rerun with --debug for the traceback and report it")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    RUNNING.clear()
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops a run even when this process was started with SIGINT ignored (as a
        # shell's background job is): the run then stops cleanly and says how to resume.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.func(args)
    except BaseException as err:  # noqa: BLE001 - every failure ends in one line and a code
        if isinstance(err, SystemExit):
            raise
        code, line = _classify(err)
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        print(f"error: {line}" if code != EXIT_INTERRUPTED else "interrupted", file=sys.stderr)
        url = RUNNING.get("url")   # only a run that started has anything to resume
        if url and args.command == "run" and code in (EXIT_INTERRUPTED, EXIT_CLUSTER, EXIT_TASK,
                                                      EXIT_STORAGE):
            print(f"the run store keeps every committed stage; continue with: spotlight run "
                  f"--resume {url}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
