"""The dashboard: the URL a run prints serves Dask's Bokeh dashboard, and its Spotlight page
shows every run on the scheduler live (iteration, stage, planner, τ, preemptions, cost)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest
import yaml

from pipelines.front.session import Session
from pipelines.observe.dashboard_page import page_html, runs_html
from pipelines.observe.live import LiveState, initial_state, live_observers
from pipelines.run.state import IterationResult
from spotlight.config import load_config
from spotlight.exploration.planner import Plan
from tests.pipelines.conftest import TINY_WORLD
from tests.ports import free_port

pytestmark = pytest.mark.timeout(600)   # the first run of a session trains the tiny models


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def runs_json(base: str) -> dict:
    return {run["run"]: run for run in json.loads(fetch(f"{base}/spotlight/runs.json"))["runs"]}


def wait_for(base: str, url: str, check, timeout: float = 10.0) -> dict:
    """The run's published state once ``check`` holds for it (it is published in a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        run = runs_json(base).get(url)
        if run is not None and check(run):
            return run
        assert time.monotonic() < deadline, f"the page never showed it; last: {run}"
        time.sleep(0.1)


def same(shown, recorded) -> bool:
    """The page's number is the run's (NaN shows as none: JSON has no NaN)."""
    if recorded is None or math.isnan(recorded):
        return shown is None
    return shown == pytest.approx(recorded)


def result(iteration: int, **changes) -> IterationResult:
    values = dict(iteration=iteration, mode="spotlight", reward_mean=0.25, group_reward_std=0.1,
                  zero_std_groups=0, loss=0.5, kl_to_reference=0.0, clip_fraction=0.0,
                  val_reward=0.4, explored=12, planned=12, filled=0, start=100.0, end=103.5,
                  cost_usd=0.01, cost_total_usd=0.0123, kendall_tau=0.61, audit_tau=0.42,
                  plan_candidates=6, plan_steps=3, preemptions=2)
    return IterationResult(**{**values, **changes})


# --- a real run on the embedded cluster ---------------------------------------------------------

@pytest.fixture
def dashboard_run_config(tmp_path):
    """The tiny world with its dashboard on and the planner choosing (one cheap arm)."""
    path = tmp_path / "tiny-dashboard.yaml"
    path.write_text(yaml.safe_dump({**TINY_WORLD, "iterations": 2,
                                    "cluster": {"dashboard": True, "worker_wait_s": 20},
                                    "planner": {"enabled": True, "candidates": [6],
                                                "steps": [0]}}))
    return load_config(path)


def test_the_printed_dashboard_is_bokeh_and_its_spotlight_page_shows_the_run_live(
        dashboard_run_config, tmp_path):
    mid_run: dict = {}

    def on_event(kind: str, info: dict) -> None:
        """The user's callback hears each event before the page's observer does: what the
        page shows then is the run's state up to the event before."""
        if kind != "stage_start" or "base" not in mid_run:
            return
        base, url = mid_run["base"], mid_run["url"]
        if (info["iteration"], info["stage"]) == (0, "train"):   # the rollout just finished
            mid_run["stage"] = wait_for(base, url, lambda r: r["stage"] == "rollout")
        if (info["iteration"], info["stage"]) == (1, "rollout"):
            mid_run["state"] = wait_for(base, url, lambda r: r["completed"] == 1)
            mid_run["page"] = fetch(f"{base}/spotlight")

    with Session.from_config(dashboard_run_config, store=str(tmp_path / "run"),
                             on_event=on_event) as session:
        link = session.dashboard_link   # what `spotlight run` prints as "dashboard:"
        assert link and link.startswith("http://127.0.0.1:") and link.endswith("/status")
        base = link[: -len("/status")]
        status = fetch(link)
        assert "Dask needs bokeh" not in status   # the stub Dask serves without Bokeh
        assert "bokeh" in status.lower() and 'href="spotlight"' in status   # our tab in Dask's bar
        assert "<title> Workers </title>" in fetch(f"{base}/info/main/workers.html")
        mid_run.update(base=base, url=session.url)
        session.run(2)
        done = wait_for(base, session.url, lambda r: r["completed"] == 2)
        page = fetch(f"{base}/spotlight")
        last = session.results[1]

    assert mid_run["stage"]["iteration"] == 0 and mid_run["stage"]["status"] == "running"
    state = mid_run["state"]   # after iteration 0, before iteration 1 started
    assert state["status"] == "running" and state["mode"] == "spotlight"
    assert state["target_iterations"] == 2 and len(state["history"]) == 1
    assert state["plan"]["iteration"] == 1 and state["plan"]["candidates"] == 6
    assert state["plan"]["reason"]                    # the planner's own words
    assert state["cost_total_usd"] is not None and state["cost_total_usd"] >= 0
    assert state["preemptions"]["total"] == 0 and state["base_val_reward"] is not None
    assert session.url in mid_run["page"] and "N=6" in mid_run["page"]
    assert same(done["audit_tau"], last.audit_tau) and same(done["kendall_tau"], last.kendall_tau)
    assert done["cost_total_usd"] == pytest.approx(last.cost_total_usd)
    assert [row["iteration"] for row in done["history"]] == [0, 1]
    assert "iteration done" in page and "$" in page and "τ audit" in page
    assert len(json.dumps(done)) < 20_000   # a summary: no images, no arrays


# --- a `dask scheduler` started by hand -----------------------------------------------------------


@pytest.fixture
def preloaded_scheduler():
    """``dask scheduler --preload pipelines.observe.dashboard_page`` on loopback: the one flag
    the README tells users of their own cluster to add."""
    port, http = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", f"127.0.0.1:{http}",
         "--preload", "pipelines.observe.dashboard_page"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, deadline = f"http://127.0.0.1:{http}", time.monotonic() + 60
    while True:
        try:
            fetch(f"{base}/spotlight/runs.json", timeout=2)
            break
        except OSError:
            assert proc.poll() is None, "dask scheduler exited"
            assert time.monotonic() < deadline, "dask scheduler never served the page"
            time.sleep(0.2)
    yield f"tcp://127.0.0.1:{port}", base
    proc.kill()
    proc.wait()


def fake_session(url: str, client) -> SimpleNamespace:
    config = SimpleNamespace(source="configs/digits.yaml", iterations=3)
    return SimpleNamespace(config=config, mode="spotlight", store=SimpleNamespace(url=url),
                           cluster=SimpleNamespace(client=client, dashboard=True))


def test_a_dask_scheduler_with_the_preload_lists_every_run_live(preloaded_scheduler):
    from distributed import Client

    address, base = preloaded_scheduler
    assert "No Spotlight run" in fetch(f"{base}/spotlight")
    with Client(address, timeout=30) as client:
        one, two = (live_observers(fake_session(url, client))[0]
                    for url in ("s3://bucket/runs/one", "/tmp/runs/two"))
        one("stage_start", {"iteration": 0, "stage": "train"})
        one("plan", {"iteration": 1, "plan": Plan(1, 24, 7, 2, 12.5, 14.0, 3, "ucb")})
        one("preemptions", {"stage": "explore", "summary": {"preemptions_hard": 1,
                                                             "preemptions_graceful": 2}})
        state = wait_for(base, "s3://bucket/runs/one", lambda r: r["stage"] == "train" and
                         r["preemptions"]["current"] == 3)
        assert state["iteration"] == 0 and state["plan"]["candidates"] == 24
        two("iteration_done", {"iteration": 0, "result": result(0)})
        state = wait_for(base, "/tmp/runs/two", lambda r: r["completed"] == 1)
        assert state["audit_tau"] == 0.42 and state["preemptions"]["total"] == 2
        page = fetch(f"{base}/spotlight")
        assert "s3://bucket/runs/one" in page and "/tmp/runs/two" in page
        assert "N=24 × M=7, 12.5 s of 14.0 s" in page and "$0.0123" in page
        one.close()
        two.close()
        assert runs_json(base)["s3://bucket/runs/one"]["status"] == "closed"   # kept: a record
        assert 'href="spotlight"' in fetch(f"{base}/status")


# --- never in the run's way --------------------------------------------------------------------

class BrokenClient:
    status = "running"

    def __init__(self) -> None:
        self.calls = 0

    def set_metadata(self, key, value) -> None:
        self.calls += 1
        raise OSError("scheduler unreachable")


def test_a_scheduler_that_fails_does_not_stop_the_run(caplog):
    client = BrokenClient()
    live = LiveState(client, "runs/x", initial_state(fake_session("runs/x", client)),
                     publish_s=0.01)
    for k in range(200):   # hearing an event never waits for the scheduler, nor raises
        live("stage_start", {"iteration": k, "stage": "rollout"})
        live("iteration_done", {"iteration": k, "result": result(k, audit_tau=float("nan"))})
    live.close()
    assert client.calls >= 1
    assert sum("did not get this run's state" in r.message for r in caplog.records) == 1
    state = live.snapshot()
    assert len(state["history"]) == 20 and state["audit_tau"] is None   # NaN is not JSON
    assert state["completed"] == 200 and state["status"] == "closed"


def test_no_dashboard_no_observer():
    session = fake_session("runs/x", BrokenClient())
    session.cluster.dashboard = False
    assert live_observers(session) == []


def test_the_page_escapes_what_runs_report():
    evil = {**initial_state(fake_session("<script>alert(1)</script>", None)),
            "plan": {"candidates": 6, "steps": 3, "reason": "<b>x</b>'"}}
    html = page_html([evil], time.time())
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html
    assert "<b>x</b>" not in runs_html([evil], time.time())
    assert "No Spotlight run" in runs_html([], time.time())
