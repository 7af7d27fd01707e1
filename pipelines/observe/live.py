"""The live state of a run for the Dask dashboard's Spotlight page.

:class:`LiveState` hears a Session's events and keeps a small summary of the run: the
iteration and stage, the planner's choice, τ, preemptions, cost so far, the last iterations'
metrics and a few operator events -- numbers and short strings only, never images or arrays.
A thread of its own publishes it to the scheduler as metadata under ``("spotlight", RUN_URL)``
(:mod:`pipelines.observe.dashboard_page` serves it) at most every ``PUBLISH_S`` seconds, and
every ``HEARTBEAT_S`` seconds while nothing happens (the page's "last heard" tells a driver
that died from one that waits). Hearing an event takes a lock and a few assignments; a slow,
lost or page-less scheduler never holds the run up, and a failed publication is logged once.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from typing import Any, Callable

from pipelines.observe.dashboard_page import METADATA_KEY

log = logging.getLogger("spotlight.observe")

PUBLISH_S = 0.5         # at most this often
HEARTBEAT_S = 10.0      # at least this often
CLOSE_WAIT_S = 5.0      # the last publication (status "closed") waits this long at most
HISTORY_ROWS = 20       # iterations kept on the page
EVENT_ROWS = 12         # operator events kept on the page
HISTORY_KEYS = ("iteration", "reward_mean", "val_reward", "audit_tau", "kendall_tau",
                "fidelity_state", "plan_candidates", "plan_steps", "preemptions",
                "cost_total_usd", "wall_s")
PLAN_KEYS = ("iteration", "candidates", "steps", "prompts", "predicted_s", "budget_s",
             "reason", "slots")


def live_observers(session: Any) -> list[Any]:
    """The live page's observer; none for an embedded cluster without a dashboard (no page
    to show it on). A scheduler started elsewhere gets it: its page may be loaded there."""
    if not getattr(session.cluster, "dashboard", True):
        return []
    return [LiveState(session.cluster.client, session.store.url, initial_state(session))]


def initial_state(session: Any) -> dict:
    config, now = session.config, time.time()
    return {"run": session.store.url, "mode": session.mode, "config": str(config.source or ""),
            "status": "running", "driver": None, "started_at": now, "updated_at": now,
            "published_at": now, "target_iterations": config.iterations, "iteration": None,
            "stage": "starting", "stage_since": now, "last_done": None, "completed": 0,
            "plan": None, "fidelity": None, "audit_tau": None, "kendall_tau": None,
            "preemptions": {"total": 0, "current": 0}, "cost_total_usd": None,
            "reward_mean": None, "val_reward": None, "base_val_reward": None,
            "history": [], "events": []}


class LiveState:
    """An event observer that publishes the run's summary to the scheduler (see module)."""

    def __init__(self, client: Any, run_url: str, state: dict, *, publish_s: float = PUBLISH_S,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.client, self.key, self.state = client, [METADATA_KEY, run_url], state
        self.publish_s, self.heartbeat_s = publish_s, heartbeat_s
        self._lock = threading.Lock()
        self._changed, self._closing = threading.Event(), threading.Event()
        self._warned = False
        self._changed.set()   # the run shows at once
        self._thread = threading.Thread(target=self._publish_loop, daemon=True,
                                        name="spotlight-live-page")
        self._thread.start()

    def __call__(self, kind: str, info: dict) -> None:
        update = UPDATES.get(kind)
        if update is None:
            return
        with self._lock:
            update(self.state, info, time.time())
            self.state["updated_at"] = time.time()
        self._changed.set()

    def snapshot(self) -> dict:
        """The state as published (a JSON-able copy)."""
        with self._lock:
            self.state["published_at"] = time.time()
            return json.loads(json.dumps(self.state, default=str))

    def close(self) -> None:
        with self._lock:
            self.state.update(status="closed", stage=None, stage_since=None,
                              updated_at=time.time())
        self._closing.set()
        self._changed.set()
        self._thread.join(CLOSE_WAIT_S)

    # --- publishing -------------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        while True:
            self._changed.wait(self.heartbeat_s)
            closing = self._closing.is_set()
            self._changed.clear()
            self._publish()
            if closing:
                return
            self._closing.wait(self.publish_s)   # throttle; a close publishes at once

    def _publish(self) -> None:
        try:
            if str(getattr(self.client, "status", "running")) != "running":
                return   # the scheduler is gone or going: nothing to tell
            self.client.set_metadata(self.key, self.snapshot())
        except Exception as err:  # noqa: BLE001 - the page is a view; the run goes on
            if not self._warned:
                self._warned = True
                log.warning("the dashboard's Spotlight page did not get this run's state (%s: "
                            "%s); the run goes on", type(err).__name__, err)


# --- what each event changes ------------------------------------------------------------------

def _number(value: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _plain(value: Any) -> Any:
    """A JSON-able scalar: numbers (finite), strings, booleans and None; enums by value."""
    value = getattr(value, "value", value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return _number(value)
    return str(value)[:200]


def _event(state: dict, kind: str, text: str, now: float) -> None:
    event = {"at": now, "kind": kind, "text": text[:300]}
    state["events"] = (state["events"] + [event])[-EVENT_ROWS:]


def _stage_start(state: dict, info: dict, now: float) -> None:
    state.update(iteration=_plain(info.get("iteration")), stage=_plain(info.get("stage")),
                 stage_since=now)


def _stage_done(state: dict, info: dict, now: float) -> None:
    state["last_done"] = f"{_plain(info.get('stage'))} of iteration {_plain(info.get('iteration'))}"


def _plan(state: dict, info: dict, now: float) -> None:
    plan = info.get("plan")
    fields = dataclasses.asdict(plan) if dataclasses.is_dataclass(plan) else dict(plan or {})
    state["plan"] = {key: _plain(fields.get(key)) for key in PLAN_KEYS}


def _fidelity(state: dict, info: dict, now: float) -> None:
    decision = info.get("decision")
    fields = {key: _plain(getattr(decision, key, None))
              for key in ("iteration", "tau", "rolling_tau", "state", "reason")}
    state["fidelity"] = fields
    _event(state, "fidelity", f"{fields['state']}: {fields['reason']}", now)


def _preemptions(state: dict, info: dict, now: float) -> None:
    summary = info.get("summary") or {}
    hard, graceful = summary.get("preemptions_hard", 0), summary.get("preemptions_graceful", 0)
    state["preemptions"]["current"] += int(hard or 0) + int(graceful or 0)
    gave_up = f"; gave up: {summary['gave_up']}" if summary.get("gave_up") else ""
    _event(state, "preemptions", f"{_plain(info.get('stage'))}: {hard} hard, {graceful} "
                                 f"graceful{gave_up}", now)


def _operator(kind: str) -> Callable[[dict, dict, float], None]:
    """Injector, dispatch and lease events: one line of their scalar fields."""
    def note(state: dict, info: dict, now: float) -> None:
        what = info.get("kind", info.get("what", ""))
        rest = ", ".join(f"{k}={_plain(v)}" for k, v in info.items()
                         if k not in ("kind", "what", "at") and not isinstance(v, (dict, list)))
        _event(state, kind, f"{_plain(what)} {rest}".strip(), now)
        if kind == "lease":
            state["driver"] = f"{_plain(info.get('host'))} pid {_plain(info.get('pid'))}"
    return note


def _iteration_done(state: dict, info: dict, now: float) -> None:
    result = info["result"]
    row = {key: _plain(getattr(result, key, None)) for key in HISTORY_KEYS}
    state["history"] = (state["history"] + [row])[-HISTORY_ROWS:]
    preemptions = state["preemptions"]
    preemptions.update(total=preemptions["total"] + int(result.preemptions or 0), current=0)
    state.update(completed=int(result.iteration) + 1, stage="iteration done", stage_since=now,
                 last_done=f"iteration {result.iteration}", audit_tau=row["audit_tau"],
                 kendall_tau=row["kendall_tau"], cost_total_usd=row["cost_total_usd"],
                 reward_mean=row["reward_mean"])
    state["fidelity"] = {**(state["fidelity"] or {}), "state": row["fidelity_state"]}
    if row["val_reward"] is not None:
        state["val_reward"] = row["val_reward"]
    if state["plan"] is None or state["plan"].get("iteration") != result.iteration + 1:
        state["plan"] = {"iteration": result.iteration + 1, "candidates": row["plan_candidates"],
                         "steps": row["plan_steps"], "predicted_s": _plain(result.plan_predicted_s),
                         "budget_s": _plain(result.plan_budget_s), "reason": None}


def _validation_done(state: dict, info: dict, now: float) -> None:
    grid = info.get("grid")   # only its mean: the images stay in the run store
    mean = _number(getattr(grid, "mean_reward", None))
    state["val_reward"] = mean if mean is not None else state["val_reward"]
    if info.get("version") == 0:
        state["base_val_reward"] = mean


UPDATES: dict[str, Callable[[dict, dict, float], None]] = {
    "stage_start": _stage_start, "stage_done": _stage_done, "plan": _plan,
    "fidelity": _fidelity, "preemptions": _preemptions, "iteration_done": _iteration_done,
    "validation_done": _validation_done, "injector": _operator("injector"),
    "lease": _operator("lease"),
    "dispatch": _operator("dispatch")}
