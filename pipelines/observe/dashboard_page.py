"""The Spotlight page of the Dask dashboard: every run that reports to this scheduler, live.

A run's driver publishes a small summary of its state as scheduler metadata under
``("spotlight", RUN_URL)`` (:mod:`pipelines.observe.live`); this module, loaded into the
scheduler, serves it next to Dask's own pages:

* ``/spotlight``           the page (plain HTML; refreshes itself every 2 s)
* ``/spotlight/runs``      the page's run list alone (what the page polls)
* ``/spotlight/runs.json`` the same as JSON

An embedded cluster's scheduler loads it by itself. A scheduler started with ``dask scheduler``
loads it with ``--preload pipelines.observe.dashboard_page`` (Spotlight installed there), or
the Dask config ``distributed.scheduler.preload: [pipelines.observe.dashboard_page]``. The
module imports nothing but the standard library, tornado and distributed: a scheduler gets no
torch from it.
"""
from __future__ import annotations

import html
import json
import time
from typing import Any

from distributed.http.utils import RequestHandler

METADATA_KEY = "spotlight"
PAGE = "spotlight"
REFRESH_MS = 2000


def runs_of(scheduler: Any) -> list[dict]:
    """The runs that reported to ``scheduler``, the most recently started first."""
    runs = getattr(scheduler, "task_metadata", {}).get(METADATA_KEY, {})
    found = [r for r in runs.values() if isinstance(r, dict)] if isinstance(runs, dict) else []
    return sorted(found, key=lambda r: -float(r.get("started_at") or 0.0))


# --- the handlers ---------------------------------------------------------------------------------

class SpotlightPage(RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(page_html(runs_of(self.server), time.time()))


class SpotlightRuns(RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(runs_html(runs_of(self.server), time.time()))


class SpotlightJSON(RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps({"now": time.time(), "runs": runs_of(self.server)}, default=str))


# What ``distributed.scheduler.http.routes`` reads from a module listed there (another way to
# serve the page; the preload below is the one the project uses).
routes: list[tuple] = [(PAGE, SpotlightPage, {}), (f"{PAGE}/runs", SpotlightRuns, {}),
                       (f"{PAGE}/runs.json", SpotlightJSON, {})]


def dask_setup(scheduler: Any) -> None:
    """Preload hook (``dask scheduler --preload pipelines.observe.dashboard_page``)."""
    install(scheduler)


def install(scheduler: Any) -> bool:
    """Serve the page from ``scheduler``'s HTTP server (once), and name it in the dashboard's
    navigation bar; False where the scheduler serves no HTTP."""
    app = getattr(scheduler, "http_application", None)
    if app is None or getattr(scheduler, "_spotlight_page", False):
        return app is not None
    prefix = _prefix(app)
    app.add_handlers(r".*$", [(f"{prefix}/{path}", cls, {**kwargs, "dask_server": scheduler})
                              for path, cls, kwargs in routes])
    scheduler._spotlight_page = True
    if app.applications:   # Bokeh's pages are served: add "Spotlight" to their navigation
        _add_navigation(scheduler)
    return True


def _prefix(app: Any) -> str:
    """The dashboard's path prefix (``dask scheduler --dashboard-prefix``), as Bokeh's pages
    have it; '' for none."""
    for application in getattr(app, "applications", ()):
        prefix = getattr(application, "prefix", None)
        if isinstance(prefix, str):
            return prefix.strip("/") and "/" + prefix.strip("/")
    return ""


def _add_navigation(scheduler: Any) -> None:
    try:   # Dask's own page list (shared by every Bokeh page of this scheduler)
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]
    except Exception:  # noqa: BLE001 - another Dask version: the page is served all the same
        return
    if PAGE not in pages:
        pages.append(PAGE)


# --- rendering ------------------------------------------------------------------------------------

STYLE = """
body { font-family: sans-serif; margin: 0; color: #222; }
nav { background: #333; padding: 6px 12px; }
nav a { color: #eee; margin-right: 16px; text-decoration: none; }
main { padding: 8px 16px; }
table { border-collapse: collapse; margin: 6px 0 14px; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.running { color: #0a6; font-weight: bold; }
.closed { color: #888; }
.quiet { color: #888; font-size: 12px; }
h2 { font-size: 16px; margin: 18px 0 4px; }
"""

SCRIPT = """
setInterval(async () => {
  try {
    const r = await fetch(location.pathname.replace(/\\/+$/, "") + "/runs", {cache: "no-store"});
    if (r.ok) document.getElementById("runs").innerHTML = await r.text();
  } catch (e) { /* the scheduler went away: keep the last view */ }
}, %d);
""" % REFRESH_MS


def page_html(runs: list[dict], now: float) -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Spotlight runs</title>"
            f"<style>{STYLE}</style></head><body>"
            "<nav><a href='status'>Dask status</a><a href='workers'>Workers</a>"
            "<a href='tasks'>Tasks</a><a href='info'>Info</a><a href='spotlight'>Spotlight</a>"
            "</nav>"
            f"<main><div id='runs'>{runs_html(runs, now)}</div></main>"
            f"<script>{SCRIPT}</script></body></html>")


def runs_html(runs: list[dict], now: float) -> str:
    """The summary table of every run, then each run's recent iterations and events."""
    if not runs:
        return ("<p>No Spotlight run has reported to this scheduler yet. A run started with "
                "<code>spotlight run</code> or <code>spotlight.Session</code> on this cluster "
                "shows here within a second of its start.</p>")
    head = ("Run", "Mode", "Status", "Iteration", "Done", "Stage", "Planner (next)", "Fidelity",
            "τ audit", "τ selected", "Preemptions", "Cost so far", "Reward", "Val reward",
            "Last heard")
    rows = "".join(_summary_row(run, now) for run in runs)
    out = [f"<h2>Runs on this scheduler ({len(runs)})</h2>",
           f"<table class='runs'><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{rows}</table>"]
    for run in runs:
        out.append(_run_details(run))
    return "".join(out)


def _summary_row(run: dict, now: float) -> str:
    status = str(run.get("status", "?"))
    target = run.get("target_iterations")
    done = _text(run.get("completed")) + (f" of {_text(target)}" if target else "")
    cells = [
        (_esc(run.get("run")), ""), (_esc(run.get("mode")), ""),
        (f"<span class='{_esc(status)}'>{_esc(status)}</span>", ""),
        (_text(run.get("iteration")), "num"), (done, "num"), (_stage(run, now), ""),
        (_plan(run.get("plan")), ""),
        (_esc((run.get("fidelity") or {}).get("state")), ""),
        (_num(run.get("audit_tau"), "{:.3f}"), "num"),
        (_num(run.get("kendall_tau"), "{:.3f}"), "num"),
        (_preemptions(run.get("preemptions") or {}), "num"),
        (_num(run.get("cost_total_usd"), "${:.4f}"), "num"),
        (_num(run.get("reward_mean"), "{:.4f}"), "num"),
        (_num(run.get("val_reward"), "{:.4f}"), "num"),
        (_ago(run.get("published_at"), now), "num")]
    return "<tr>" + "".join(f"<td class='{c}'>{v}</td>" for v, c in cells) + "</tr>"


def _run_details(run: dict) -> str:
    out = [f"<h2>{_esc(run.get('run'))}</h2><p class='quiet'>mode {_esc(run.get('mode'))}, "
           f"config {_esc(run.get('config'))}, driver {_esc(run.get('driver'))}; "
           f"{_text(run.get('completed'))} iterations done; validation reward of the base "
           f"model {_num(run.get('base_val_reward'), '{:.4f}')}"
           f"{'; last stage done: ' + _esc(run.get('last_done')) if run.get('last_done') else ''}"
           "</p>"]
    history = run.get("history") or []
    if history:
        cols = (("iteration", "It.", "{}"), ("reward_mean", "Reward", "{:.4f}"),
                ("val_reward", "Val reward", "{:.4f}"), ("audit_tau", "τ audit", "{:.3f}"),
                ("kendall_tau", "τ selected", "{:.3f}"), ("fidelity_state", "Fidelity", "{}"),
                ("plan_candidates", "N", "{}"), ("plan_steps", "M", "{}"),
                ("preemptions", "Preempt.", "{}"), ("wall_s", "Wall s", "{:.1f}"),
                ("cost_total_usd", "Cost so far", "${:.4f}"))
        body = "".join("<tr>" + "".join(f"<td class='num'>{_num(row.get(key), fmt)}</td>"
                                        for key, _, fmt in cols) + "</tr>"
                       for row in reversed(history))
        out.append(f"<table><tr>{''.join(f'<th>{h}</th>' for _, h, _ in cols)}</tr>{body}</table>")
    events = run.get("events") or []
    if events:
        items = "".join(f"<li>{time.strftime('%H:%M:%S', time.localtime(e.get('at') or 0))} "
                        f"{_esc(e.get('kind'))}: {_esc(e.get('text'))}</li>"
                        for e in reversed(events))
        out.append(f"<p class='quiet'>Recent events</p><ul class='quiet'>{items}</ul>")
    return "".join(out)


def _stage(run: dict, now: float) -> str:
    stage = run.get("stage")
    if not stage:
        return "–"
    since = run.get("stage_since")
    running = f" ({_duration(now - since)})" if since and run.get("status") == "running" else ""
    return f"{_esc(stage)}{running}"


def _plan(plan: dict | None) -> str:
    if not plan:
        return "–"
    text = f"N={_text(plan.get('candidates'))} × M={_text(plan.get('steps'))}"
    if plan.get("predicted_s") is not None:
        text += f", {_num(plan.get('predicted_s'), '{:.1f}')} s"
        if plan.get("budget_s") is not None:
            text += f" of {_num(plan.get('budget_s'), '{:.1f}')} s"
    reason = plan.get("reason")
    return f"<span title='{_esc(reason)}'>{text}</span>" if reason else text


def _preemptions(p: dict) -> str:
    text = _text(p.get("total", 0))
    live = p.get("current")
    return text + (f" (+{_text(live)} now)" if live else "")


def _esc(value: Any) -> str:
    return "–" if value is None else html.escape(str(value), quote=True)


def _text(value: Any) -> str:
    return _esc(value)


def _num(value: Any, fmt: str) -> str:
    if value is None:
        return "–"
    try:
        return html.escape(fmt.format(value))
    except (ValueError, TypeError):
        return _esc(value)


def _duration(seconds: float) -> str:
    seconds = max(float(seconds), 0.0)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _ago(at: Any, now: float) -> str:
    return "–" if not at else f"{_duration(now - float(at))} ago"
