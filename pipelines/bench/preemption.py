"""``spotlight bench preemption``: the digits run with and without a replayed spot trace.

1. *clean*: spotlight mode, 1 gpu + 2 spot workers, exploration settings fixed (planner off)
   and the deadline off, so every planned request runs;
2. *chaos*: the same run (same seeds) while a spot trace is replayed against the spot workers:
   drops alternate a SIGKILL (no warning) and a SIGTERM notice (graceful), rises start fresh
   workers. ``identical_to_clean`` compares the final weights and every reward bit for bit.
3. *balance*: one spot worker is slowed to half speed (SIGSTOP/SIGCONT duty cycle, like a
   slower GPU) and the same exploration requests run with pull and with push dispatch.
4. *sp*: the rollout's requests on sequence-parallel pairs of spot workers
   (``parallel.size_classes``), clean and while the trace SIGKILLs group members mid-request:
   the groups regroup, cut requests resume from their committed steps, and the chaos run's
   weights and rewards are compared bit for bit with the clean SP run's.

``--quick`` runs scenarios 1 and 2 alone, smaller; ``--scenarios`` picks any of ``main`` (1 and
2), ``balance`` and ``sp``. The JSON is rewritten after each scenario, so a bench cut short
keeps what it measured (``complete`` says whether every chosen scenario ran).

Lost steps of a hard kill are measured in time: (kill - the attempt's last commit) / the
per-step compute time of the clean run. Recovery is kill (or notice) -> the first step the
next attempt commits elsewhere.
"""
from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pipelines.bench.registry import machine, register_bench, write_result
from pipelines.cluster import SPOT
from pipelines.front.session import Session
from pipelines.run import tasks
from pipelines.run.exploration import explore_requests
from spotlight.config import PROJECT_ROOT, RunConfig, load_config, shipped_config
from spotlight.models.pretrain import pretrain
from spotlight.rewards import build_reward
from spotlight.scheduling.traces import load_trace, longest_outage_s, replay_schedule, scale_to_cap
from storage import RunStore, stage_key

DEFAULT_TRACE = "g4dn-events.csv"
MIN_DROP_GAP_S = 8.0   # the default time scale spaces drops about this far apart (median)
OUTAGE_MARGIN_S = 60.0   # a replacement spot worker's start and weight load, with room to spare
SCENARIOS = ("main", "balance", "sp")


def chosen_scenarios(names: list[str] | None, quick: bool) -> tuple[str, ...]:
    """The scenarios to run, in the bench's order: ``names``, or all (``main`` alone when
    ``quick``)."""
    if not names:
        return ("main",) if quick else SCENARIOS
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"--scenarios {','.join(names)}: unknown {', '.join(unknown)}; "
                         f"expected some of {', '.join(SCENARIOS)}")
    return tuple(name for name in SCENARIOS if name in names)


def default_trace() -> Path:
    """The shipped g4dn event trace: $SPOTLIGHT_TRACES, else the repository's configs/traces."""
    root = os.environ.get("SPOTLIGHT_TRACES") or str(PROJECT_ROOT / "configs" / "traces")
    path = Path(root) / DEFAULT_TRACE
    if not path.is_file():
        raise FileNotFoundError(f"the default spot trace {path} is not there; pass --trace PATH "
                                "(a count JSON or an event CSV) or set SPOTLIGHT_TRACES")
    return path


def fit_time_scale(trace_path: Path, cap: int, min_gap_s: float = MIN_DROP_GAP_S) -> float:
    """Wall seconds per trace second that space the trace's drops ``min_gap_s`` apart (median).

    Faster than that and a fresh spot worker (a new process: imports, weights) is killed before
    it commits a step, which measures the start-up cost instead of the scheduler.
    """
    trace = scale_to_cap(load_trace(trace_path), cap)
    drops = [e.trace_s for e in replay_schedule(trace, 1.0) if e.change < 0]
    if not drops:
        raise ValueError(f"{trace_path}: the trace never removes a spot node; nothing to replay")
    gaps = np.diff(drops)
    gap = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else drops[0] or 1.0
    return min_gap_s / gap


def _run(config: RunConfig, url: str, iterations: int) -> dict:
    with Session.from_config(config, store=url) as session:
        session.run(iterations)
        out = {"results": session.results, "records": session.task_records(),
               "injector": session.injector.log if session.injector else [],
               "injector_summary": session.injector.summary() if session.injector else None}
    store = RunStore.open(url, create=False)
    out["dispatch"] = dispatch_logs(store, iterations)
    return out


def dispatch_logs(store: RunStore, iterations: int) -> list[dict]:
    """The pull-dispatch record of every pulled stage of the run: explorations, audits and
    (with ``placement.rollout`` on spot) rollouts."""
    out = []
    for k in range(iterations + 1):
        rollout = tasks.stage_name(k, "rollout")
        if store.is_stage_done(rollout) and store.location.exists(stage_key(rollout),
                                                                  "dispatch.json"):
            out.append({"stage": rollout, **store.get_json(rollout, "dispatch")})
        for stage, name in (("explore", "candidates"), ("audit", "audit")):
            if store.is_stage_done(tasks.stage_name(k, stage)):
                data = store.get_json(tasks.stage_name(k, stage), name)
                if data.get("dispatch"):
                    out.append({"stage": tasks.stage_name(k, stage), **data["dispatch"]})
    return out


def preemptions_by_stage(dispatch: list[dict]) -> dict[str, dict[str, int]]:
    """Hard and graceful preemptions of requests per kind of stage (explore, audit, rollout)."""
    out: dict[str, dict[str, int]] = {}
    for entry in dispatch:
        kind = entry["stage"].rsplit("/", 1)[-1]
        into = out.setdefault(kind, {"requests": 0, "hard": 0, "graceful": 0})
        into["requests"] += entry["summary"]["requests"]
        into["hard"] += entry["summary"]["preemptions_hard"]
        into["graceful"] += entry["summary"]["preemptions_graceful"]
    return out


def _identical(clean_url: str, chaos_url: str, iterations: int) -> bool:
    a, b = RunStore.open(clean_url, create=False), RunStore.open(chaos_url, create=False)
    wa, wb = a.load_checkpoint(iterations), b.load_checkpoint(iterations)
    same = all(np.array_equal(t.numpy(), wb.weights[n].numpy()) for n, t in wa.weights.items())
    ra, rb = a.open_rewards(), b.open_rewards()
    return bool(same and np.array_equal(ra["reward"].values, rb["reward"].values, equal_nan=True)
                and np.array_equal(ra["seed"].values, rb["seed"].values))


def _step_seconds(records: list[dict]) -> float:
    """Median compute time of one denoising step of an exploration request in the clean run:
    first to last committed step, so loading, decoding and scoring are left out."""
    per = [(r["last_step_at"] - r["first_step_at"]) / (r["steps"] - r["first_step"])
           for r in records if r["stage"] == "explore" and r.get("first_step_at")
           and r.get("last_step_at") and r.get("steps", 0) > r.get("first_step", 0)]
    return float(np.median(per)) if per else float("nan")


def _outage_s(events: list[dict]) -> float:
    """Seconds a stage's requests waited with no spot worker alive (starved -> next assign)."""
    total, since = 0.0, None
    for e in events:
        if e["kind"] == "starved" and since is None:
            since = e["at"]
        elif e["kind"] == "assigned" and since is not None:
            total, since = total + e["at"] - since, None
    return total


def preemption_figures(chaos: dict, step_s: float) -> dict:
    """Lost steps and recovery times from the injector's and the dispatcher's logs."""
    kills = {e["worker"]: e["at"] for e in chaos["injector"] if e["kind"] in ("kill", "notice")}
    final = {}   # (stage, request) -> record of the attempt that finished
    for r in chaos["records"]:
        if r["stage"] in ("explore", "audit", "rollout") and r.get("request"):
            final[(f"iter-{r['iteration']}/{r['stage']}", r["request"])] = r
    hard, graceful, recovery, max_pre, outage, newcomers = [], [], [], 0, 0.0, []
    for stage in chaos["dispatch"]:
        max_pre = max(max_pre, stage["summary"]["max_preemptions_of_one_request"])
        newcomers += stage["summary"].get("newcomer_ready_s", [])
        events = stage["log"]
        outage += _outage_s(events)
        for i, e in enumerate(events):
            if e["kind"] == "handed_back":
                graceful.append(e["computed_step"] - e["step"])
            if e["kind"] != "requeued":
                continue
            killed_at = kills.get(e["worker"])
            if killed_at is None:
                continue
            if e["hard"] and e.get("committed_at") is None:
                hard.append(0.0)   # its stream was never opened: no step had been computed
            elif e["hard"]:
                # Work since the later of its last commit and its assignment (a resumed
                # attempt's last commit is the earlier attempt's) is lost, in clean step times.
                assigned = [a["at"] for a in events[:i] if a["kind"] == "assigned"
                            and a["request"] == e["request"]]
                since = max([e["committed_at"]] + assigned[-1:])
                hard.append(max(killed_at - since, 0.0) / step_s)
            later = [a for a in events[i + 1:] if a["kind"] in ("requeued", "handed_back")
                     and a["request"] == e["request"]]
            record = final.get((stage["stage"], e["request"]))
            if not later and record and record.get("first_step_at"):
                recovery.append(record["first_step_at"] - killed_at)
    def pct(xs, q):
        return float(np.percentile(xs, q)) if xs else None

    return {"lost_steps_per_preemption": {"hard": float(np.mean(hard)) if hard else None,
                                          "graceful": (float(np.mean(graceful)) if graceful
                                                       else None),
                                          "hard_each": hard, "graceful_each": graceful},
            "recovery_s": {"p50": pct(recovery, 50), "p95": pct(recovery, 95), "n": len(recovery)},
            # A spot worker joining mid-stage: from being seen to its first request (it loads
            # the stage's weights version first).
            "newcomer_ready_s": {"p50": pct(newcomers, 50), "max": max(newcomers, default=None),
                                 "n": len(newcomers)},
            "max_preemptions_of_one_request": max_pre, "step_s": step_s,
            "spot_outage_s": outage}


class Throttle:
    """Slow one worker process to ``duty`` of its speed: SIGSTOP / SIGCONT every 50 ms."""

    def __init__(self, pid: int, duty: float = 0.5, period_s: float = 0.1) -> None:
        self.pid, self.duty, self.period_s = pid, duty, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            time.sleep(self.period_s * (1 - self.duty))
            os.kill(self.pid, signal.SIGCONT)
            self._stop.wait(self.period_s * self.duty)

    def __enter__(self) -> "Throttle":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        os.kill(self.pid, signal.SIGCONT)


def balance(config: RunConfig, url: str) -> dict:
    """Busy time per spot worker, pull vs push, with one spot worker at half speed."""
    cfg = config
    with Session.from_config(cfg, store=url) as session:
        for f in session.warm_up_futures:
            f.result()
        driver, out = session.driver, {}
        slow = sorted(session.cluster.workers_by_class()[SPOT])[-1]
        pid = session.cluster.cluster.workers[slow].pid
        with Throttle(pid):
            for k, how in enumerate(("pull", "push")):
                started = time.time()
                outs = explored_by(how, driver, k)
                ended = time.time()
                busy: dict[str, float] = {}
                count: dict[str, int] = {}
                finish: dict[str, float] = {}
                for o in outs:
                    r = o.record
                    busy[r["worker"]] = busy.get(r["worker"], 0.0) + r["end"] - r["start"]
                    count[r["worker"]] = count.get(r["worker"], 0) + 1
                    finish[r["worker"]] = max(finish.get(r["worker"], 0.0), r["end"] - started)
                spread = (max(busy.values()) - min(busy.values())) / max(busy.values()) \
                    if len(busy) > 1 else 1.0
                out[how] = {"busy_s": busy, "requests": count, "finish_s": finish,
                            "makespan_s": ended - started, "busy_spread": spread,
                            "slow_worker": slow}
    out["makespan_push_over_pull"] = out["push"]["makespan_s"] / out["pull"]["makespan_s"]
    return out


def explored_by(how: str, driver, iteration: int) -> list:
    """Iteration ``iteration``'s exploration requests (weights 0) on the spot workers, pulled
    (the product's dispatch) or pushed: all assigned at once by Dask, the comparison."""
    specs = [driver.exploration.explore_spec(request) for request in explore_requests(
        driver.config, iteration, driver.prompts(iteration), 0, "explore",
        driver.config.exploration.candidates)]
    if how == "pull":
        work = driver.exploration.dispatch(specs, (SPOT,), "explore")
        driver.exploration.wait_all(work)
        return driver.exploration.collect(work, "explore")[0]
    client = driver.cluster.client
    futures = [client.submit(spec.fn, *spec.args, attempt=(driver.store.epoch, 1),
                             resources={SPOT: 1}, pure=False) for spec in specs]
    return client.gather(futures)


def sp_scenario(cfg: RunConfig, trace_path: Path, root: Path, iterations: int,
                scale: float) -> dict:
    """Scenario 4 (see the module docstring): vanilla seeds, the rollout on SP pairs of
    four spot workers, clean and under the trace's kills."""
    height, width = cfg.world.canvas_height, cfg.world.canvas_width
    sp_cfg = cfg.with_values({"mode": "vanilla", "placement.rollout": ["spot"],
                              "cluster.spot_workers": 4,
                              "parallel.size_classes": [f"{height}x{width}:2"]})
    clean = _run(sp_cfg, str(root / "sp-clean"), iterations)
    chaos = _run(sp_cfg.with_values({"injector.trace": str(trace_path.resolve()),
                                     "injector.time_scale": scale, "injector.action": "kill"}),
                 str(root / "sp-chaos"), iterations)
    store = RunStore.open(str(root / "sp-chaos"), create=False)
    summaries = [store.stage_record(f"iter-{k}/rollout")["info"]["sp"] for k in range(iterations)]
    resumed = [s for summary in summaries for s in summary["resumed_from"].values()]
    return {"identical_to_clean": _identical(str(root / "sp-clean"), str(root / "sp-chaos"),
                                             iterations),
            "sp_degree": 2, "spot_workers": 4,
            "requests": sum(s["requests"] for s in summaries),
            "attempts": sum(s["attempts"] for s in summaries),
            "group_losses": sum(s["losses"] for s in summaries),
            "resumed_requests": len(resumed), "resumed_from_steps": resumed,
            "injected": chaos["injector_summary"],
            "iteration_s": {"clean": [r.wall_s for r in clean["results"]],
                            "chaos": [r.wall_s for r in chaos["results"]]}}


@register_bench("preemption")
def bench_preemption(quick: bool = False, config: str | None = None, trace: str | None = None,
                     time_scale: float | None = None, iterations: int | None = None,
                     json_path: str | None = None, overrides: dict | None = None,
                     scenarios: list[str] | None = None, **_: object) -> dict:
    started = time.monotonic()
    chosen = chosen_scenarios(scenarios, quick)
    user_overrides = overrides or {}
    trace_path = Path(trace) if trace else default_trace()
    overrides = {"planner.enabled": False, "exploration.deadline": False,
                 "cluster.spot_workers": 2, "cluster.dashboard": False,
                 "validation.every": 1000, "fidelity.audit_every": 3,
                 # Many small requests (two per prompt): more of them in flight to preempt.
                 "exploration.request_batch": 8}
    if quick:
        overrides.update({"grpo.prompts_per_iteration": 4, "grpo.group_size": 4,
                          "grpo.micro_batch": 16, "validation.max_prompts": 8,
                          "exploration.candidates": 8, "exploration.request_batch": 4})
    cfg = load_config(config or shipped_config("digits.yaml"), {**overrides, **user_overrides})
    iterations = iterations or (3 if quick else 6)
    pretrain(cfg)
    build_reward(cfg.reward)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-preemption-"))
    scale = time_scale or fit_time_scale(trace_path, cfg.cluster.spot_workers)
    result = {"bench": "preemption", "complete": False, "scenarios": list(chosen),
              "config": cfg.source, "iterations": iterations, "trace": str(trace_path),
              "time_scale": scale, "runs": str(root), "machine": machine()}
    if "main" in chosen:
        result.update(main_scenario(cfg, trace_path, root, iterations, scale,
                                    user_overrides.get("preemption.no_spot_wait_s")))
    # Each scenario's figures are saved as soon as it ends: a bench cut short keeps them.
    later = {"balance": lambda: balance(cfg, str(root / "balance")),
             "sp": lambda: sp_scenario(cfg, trace_path, root, iterations, scale)}
    for name in (name for name in chosen if name != "main"):
        result["wall_s"] = time.monotonic() - started
        if json_path:
            write_result(result, json_path)
        result[name] = later[name]()
    result.update(complete=True, wall_s=time.monotonic() - started)
    return result


def main_scenario(cfg: RunConfig, trace_path: Path, root: Path, iterations: int, scale: float,
                  no_spot_wait_s: float | None) -> dict:
    """Scenarios 1 and 2: the run clean, then under the trace's kills and notices."""
    clean = _run(cfg, str(root / "clean"), iterations)
    # Requests wait out the trace's longest spell without spot capacity (plus a replacement's
    # start-up) instead of giving up: the bench measures what preemptions lose, not the
    # give-up policy, which has its own test.
    outage = longest_outage_s(scale_to_cap(load_trace(trace_path),
                                           cfg.cluster.spot_workers)) * scale
    wait = no_spot_wait_s if no_spot_wait_s is not None else \
        max(cfg.preemption.no_spot_wait_s, outage + OUTAGE_MARGIN_S)
    chaos_cfg = cfg.with_values({"injector.trace": str(trace_path.resolve()),
                                 "injector.time_scale": scale, "injector.action": "mixed",
                                 "preemption.no_spot_wait_s": wait})
    chaos = _run(chaos_cfg, str(root / "chaos"), iterations)
    return {"longest_outage_s": outage, "no_spot_wait_s": wait,
            **chaos_figures(cfg, clean, chaos, root, iterations)}


def chaos_figures(cfg: RunConfig, clean: dict, chaos: dict, root: Path, iterations: int) -> dict:
    """What the chaos run lost and cost against the clean run: requests, identity,
    preemptions (by kind and stage), lost steps and time."""
    figures = preemption_figures(chaos, _step_seconds(clean["records"]))
    summaries = [d["summary"] for d in chaos["dispatch"]]
    total = sum(s["requests"] for s in summaries)
    wall = lambda run: float(np.mean([r.wall_s for r in run["results"]]))   # noqa: E731
    return {
        "requests_total": total,
        "requests_lost": total - sum(s["finished"] for s in summaries),
        "identical_to_clean": _identical(str(root / "clean"), str(root / "chaos"), iterations),
        "preemptions": {"hard": sum(s["preemptions_hard"] for s in summaries),
                        "graceful": sum(s["preemptions_graceful"] for s in summaries),
                        "injected": chaos["injector_summary"]},
        "preemptions_by_stage": preemptions_by_stage(chaos["dispatch"]),
        "placement": {s: list(cfg.placed(s)) for s in ("rollout", "explore", "reward", "train")},
        **figures,
        "iteration_time_inflation": wall(chaos) / wall(clean),
        "iteration_s": {"clean": [r.wall_s for r in clean["results"]],
                        "chaos": [r.wall_s for r in chaos["results"]]},
    }
