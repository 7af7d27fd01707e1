"""The sections of ``spotlight report``'s page, each built from a :class:`RunView` alone.

Figures are drawn by the plotting code the demo and the benches use (``report``,
``timeline``) and embedded as base64 PNGs, so the page fetches nothing. Every section has a
body even when the run has nothing of its kind yet (a run before its first iteration, a mode
without exploration): a sentence that says so.
"""
from __future__ import annotations

import base64
import datetime
import math
import tempfile
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pipelines.front.audit import format_events
from pipelines.front.report import image_grid, reward_curve
from pipelines.front.timeline import plot_timeline
from pipelines.observe.run_view import RunView
from pipelines.run.state import IterationResult

MAX_GRIDS = 6           # validation grids shown: the first, the last and evenly between
MAX_EVENT_LINES = 2000  # of the event log; `spotlight audit RUN --events` prints them all
MAX_MARK_ROWS = 50


@dataclass(frozen=True)
class Section:
    id: str       # the element id (the page's navigation links to it)
    title: str
    body: str     # HTML


@dataclass(frozen=True)
class RunFacts:
    """Everything the sections show, read from the store once."""

    view: RunView
    results: list[IterationResult]
    tasks: list[dict]
    events: list[dict]
    info: dict[str, Any]


def read_facts(view: RunView) -> RunFacts:
    """One consistent read of a (possibly running) run: the task list holds the committed
    iterations' tasks, counted from the same manifest read as the results."""
    results = view.results
    return RunFacts(view, results, view.tasks(len(results)), view.events(), view.run_info())


# --- small HTML helpers ---------------------------------------------------------------------------
def figure(draw: Callable[[Path], Any], alt: str, caption: str = "") -> str:
    """``draw(path)`` writes a PNG; returned as an <img> with the PNG inline (base64)."""
    with tempfile.TemporaryDirectory(prefix="spotlight-report-") as folder:
        path = Path(folder) / "figure.png"
        draw(path)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    text = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(alt)}">'
            f"{text}</figure>")


def table(header: list[str], rows: list[list[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(fmt(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _points(results: list[IterationResult], field: str, x: str = "iteration") -> list[dict]:
    return [{x: r.iteration, "value": float(getattr(r, field))} for r in results
            if _finite(getattr(r, field))]


def _line_chart(curves: dict[str, list[dict]], alt: str, title: str, ylabel: str,
                x: str = "iteration") -> str:
    curves = {name: points for name, points in curves.items() if points}
    if not curves:
        return ""
    return figure(lambda path: reward_curve(curves, path, x=x, title=title, y="value",
                                            ylabel=ylabel), alt)


def _t0(facts: RunFacts, marks: list[dict]) -> float:
    """Time zero of the timeline: its first task's start (as ``plot_timeline`` draws it)."""
    starts = [t["start"] for t in facts.tasks] or [r.start for r in facts.results] or \
        [m["at"] for m in marks]
    return min(starts, default=0.0)


# --- the sections ---------------------------------------------------------------------------------
def summary(facts: RunFacts) -> Section:
    """Where the run stands: committed iterations, rewards, cost, and what is in progress."""
    config, results = facts.info.get("config") or {}, facts.results
    planned = config.get("iterations")
    done = len(results)
    if planned is not None and done >= planned:
        state = f"finished: {done} of {planned} iterations committed"
    else:
        doing = facts.view.stages_in_progress()
        state = (f"running or stopped: {done} of {planned if planned is not None else '?'} "
                 f"iterations committed" + (f"; iteration {done} has recorded "
                                            f"{', '.join(doing)}" if doing else ""))
    vals = [r.val_reward for r in results if _finite(r.val_reward)]
    rows = [["run", facts.view.url], ["state", state],
            ["mode", facts.info.get("mode", config.get("mode"))],
            ["validation reward", f"base {fmt(facts.view.base_val_reward)}, last "
                                  f"{fmt(vals[-1] if vals else None)}"],
            ["cost", f"${results[-1].cost_total_usd:.4f}" if results else "-"],
            ["wall time", f"{results[-1].end - results[0].start:.1f} s" if results else "-"],
            ["preemptions", sum(r.preemptions for r in results)],
            ["code version", facts.info.get("code_version")],
            ["report written", datetime.datetime.now(datetime.timezone.utc)
             .strftime("%Y-%m-%d %H:%M:%S UTC")]]
    return Section("summary", "Summary", table(["", ""], rows, "facts"))


def rewards(facts: RunFacts) -> Section:
    """Rollout (training) and validation reward by weights version, and validation by time."""
    results = facts.results
    if not results:
        return Section("rewards", "Reward and validation", note(
            "No iteration committed yet; the curves appear after the first one."))
    curve = facts.view.val_curve(results)
    by_version = {
        "rollout mean (training)": [{"weights_version": r.iteration, "value": r.reward_mean}
                                    for r in results],
        "validation": [{"weights_version": p["iteration"], "value": p["val_reward"]}
                       for p in curve]}
    charts = _line_chart(by_version, "reward by weights version", "reward by weights version",
                         "mean reward", x="weights_version")
    charts += _line_chart({"validation": [{"wall_s": p["wall_s"], "value": p["val_reward"]}
                                          for p in curve]},
                          "validation reward by wall time", "validation reward by wall time",
                          "mean validation reward", x="wall_s")
    rows = [[r.iteration, r.reward_mean, r.group_reward_std, r.zero_std_groups, r.loss,
             r.kl_to_reference, r.clip_fraction, r.val_reward, r.wall_s, r.resumed_stages]
            for r in results]
    header = ["iter", "rollout reward", "group std", "zero-std groups", "loss", "KL to ref",
              "clip frac", "validation (after)", "wall s", "resumed stages"]
    return Section("rewards", "Reward and validation",
                   f'<div class="charts">{charts}</div>' + table(header, rows))


def timeline(facts: RunFacts) -> Section:
    """Stages per worker over time, with preemptions, notices and lost workers marked."""
    marks = facts.view.preemptions(facts.events)
    if not facts.tasks:
        body = note("No task recorded yet; the timeline appears after the first iteration.")
    else:
        body = figure(lambda path: plot_timeline(facts.tasks, path, marks=marks,
                                                 title="stages per worker"),
                      "timeline of stages per worker",
                      "Markers: kill / notice (the preemption injector), lost / hand-back "
                      "(the request pool), on the worker's lane.")
    t0 = _t0(facts, marks)
    if marks:
        rows = [[f"{m['at'] - t0:.2f}", m["worker"], m["mark"], f"{m['kind']}/{m['what']}"]
                for m in marks[:MAX_MARK_ROWS]]
        body += table(["s since first task", "worker", "mark", "event"], rows, "marks")
        if len(marks) > MAX_MARK_ROWS:
            body += note(f"{len(marks) - MAX_MARK_ROWS} more marks not listed.")
    else:
        body += note("No preemption, notice or lost worker recorded in this run.")
    lines = format_events(facts.events).splitlines()
    shown = "\n".join(lines[:MAX_EVENT_LINES])
    more = (f" (first {MAX_EVENT_LINES}; `spotlight audit {facts.view.url} --events` prints "
            "all)") if len(lines) > MAX_EVENT_LINES else ""
    body += (f"<details><summary>event log: {len(facts.events)} events{escape(more)}</summary>"
             f"<pre>{escape(shown)}</pre></details>")
    return Section("timeline", "Timeline of stages per worker", body)


def planner(facts: RunFacts) -> Section:
    """Kendall τ of stale vs fresh scores, and the planner's and the fidelity monitor's choices."""
    results = facts.results
    if not results:
        return Section("planner", "τ and planner choices", note("No iteration committed yet."))
    charts = _line_chart({"kendall τ (selected seeds)": _points(results, "kendall_tau"),
                          "audit τ (random candidates)": _points(results, "audit_tau")},
                         "Kendall tau by iteration", "stale vs fresh ranking", "Kendall τ")
    charts += _line_chart({"N candidates": _points(results, "plan_candidates"),
                           "M steps": _points(results, "plan_steps")},
                          "planner choices by iteration", "planner's choice for the next "
                          "iteration", "N, M")
    if not charts:
        charts = note("No τ and no plan recorded: this run's mode does not explore seeds.")
    rows = [[r.iteration, r.kendall_tau, r.audit_tau, r.fidelity_state, r.plan_candidates,
             r.plan_steps, r.plan_predicted_s, r.plan_budget_s, r.plan_overrun, r.explored,
             r.planned, r.filled] for r in results]
    header = ["iter", "τ", "audit τ", "fidelity", "N (next)", "M (next)", "predicted s",
              "budget s", "overrun", "explored", "planned", "filled at random"]
    return Section("planner", "τ and planner choices",
                   f'<div class="charts">{charts}</div>' + table(header, rows))


def cost(facts: RunFacts) -> Section:
    """The cost ledger: per iteration, per worker class, and every worker's alive interval."""
    results, ledger = facts.results, facts.view.ledger()
    if not results or ledger is None:
        return Section("cost", "Cost ledger", note("No iteration committed yet."))
    start, end = results[0].start, results[-1].end
    chart = _line_chart({"cumulative": [{"iteration": r.iteration, "value": r.cost_total_usd}
                                        for r in results]},
                        "cumulative cost by iteration", "cumulative cost", "USD")
    body = f'<div class="charts">{chart}</div>' + table(
        ["iter", "cost USD", "cumulative USD", "wall s"],
        [[r.iteration, f"{r.cost_usd:.4f}", f"{r.cost_total_usd:.4f}", r.wall_s]
         for r in results])
    first = min((iv["start"] for iv in ledger.intervals), default=start)   # as the run counts
    seconds, prices = ledger.gpu_seconds(first, end), facts.view.prices()
    dollars = ledger.cost(first, end, prices) if prices else {}
    body += table(["worker class", "GPU-seconds", "USD per GPU-hour", "USD"],
                  [[cls, f"{s:.1f}", fmt(prices.get(cls)) if prices else "-",
                    f"{dollars[cls]:.4f}" if cls in dollars else "-"]
                   for cls, s in seconds.items()])
    body += table(["worker", "class", "joined (s)", "left (s)", "alive s"],
                  [[iv["worker"], iv["worker_class"], f"{iv['start'] - first:.1f}",
                    "alive at last commit" if iv["end"] is None else f"{iv['end'] - first:.1f}",
                    f"{(end if iv['end'] is None else iv['end']) - iv['start']:.1f}"]
                   for iv in ledger.intervals])
    return Section("cost", "Cost ledger", body)


def grids(facts: RunFacts) -> Section:
    """Validation image grids: the first, the last and a few between."""
    found = facts.view.grids()
    if not found:
        return Section("grids", "Validation image grids", note(
            "No validation grid stored yet (the first validation stores one)."))
    picks = sorted({round(i) for i in np.linspace(0, len(found) - 1, min(MAX_GRIDS, len(found)))})
    body = ""
    for grid in (found[i] for i in picks):
        images = grid.images.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
        scale = max(1, 96 // max(images.shape[-2:]))
        body += figure(lambda path, g=grid, im=images, s=scale: image_grid(
            im, g.labels, path, scale=s, rewards=g.rewards),
            f"validation grid, weights {grid.version}",
            f"weights version {grid.version}: mean validation reward {grid.mean_reward:.4f} "
            f"({len(grid.labels)} images shown)")
    if len(picks) < len(found):
        body += note(f"{len(picks)} of {len(found)} validation grids shown.")
    return Section("grids", "Validation image grids", body)


def config(facts: RunFacts) -> Section:
    """The run's stored config, as YAML, and what else the run recorded about itself."""
    info = facts.info
    if "config" not in info:
        return Section("config", "Config", note(
            "This store has no recorded config: it was not started by a Session."))
    storage = info.get("storage") or {}
    rows = [[key, info[key]] for key in ("mode", "code_version", "source") if key in info]
    rows += [["store", storage.get("url", facts.view.url)]]
    text = yaml.safe_dump(info["config"], sort_keys=True, default_flow_style=False)
    settings = yaml.safe_dump(storage, sort_keys=True, default_flow_style=False)
    return Section("config", "Config", table(["", ""], rows, "facts") +
                   f'<pre class="config">{escape(text)}</pre><details><summary>run store '
                   f"settings (no credentials are stored)</summary><pre>{escape(settings)}"
                   "</pre></details>")


SECTIONS = (summary, rewards, timeline, planner, cost, grids, config)
SECTION_IDS = ("summary", "rewards", "timeline", "planner", "cost", "grids", "config")


def report_sections(view: RunView) -> list[Section]:
    """Every section of the report, in page order."""
    facts = read_facts(view)
    return [build(facts) for build in SECTIONS]
