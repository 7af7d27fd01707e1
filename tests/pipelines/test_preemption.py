"""Spot preemption on real worker processes: SIGKILL and SIGTERM notices, pull dispatch, resume."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import numpy as np
import pytest
import torch

from pipelines.cluster import dispatch as dispatch_glue
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.cluster.injector import SpotFleet
from pipelines.front.console import preemption_line
from pipelines.front.session import Session
from pipelines.run import tasks
from pipelines.run.rollout import newcomer_warm_up
from spotlight.config import load_config
from spotlight.sim.replay import replay_decisions
from storage import RunStore

pytestmark = pytest.mark.timeout(600)
REQUEST = tasks.explore_request(0, 0)


def explore_spec(session: Session, stage: str, seeds: np.ndarray) -> RequestSpec:
    cfg = session.config
    request = tasks.ExploreRequest(0, 0, session.train_prompts[0], seeds, 0, 0, stage)
    return RequestSpec("r", tasks.explore_task, (cfg, session.store, request),
                       tasks.stage_name(0, stage), REQUEST)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_one_request_hard_killed_twice_resumes_each_time_and_equals_a_clean_one(
        tiny_run_yaml, tmp_path):
    config = load_config(tiny_run_yaml, {"sampler.num_steps": 300})
    seeds = np.arange(3)
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        store, handle = session.store, session.cluster
        clean = RequestPool(handle, [explore_spec(session, "clean", seeds)], config.preemption,
                            store=store)
        clean.wait(300)
        reference = clean.close()["r"]

        fleet_log: list[dict] = []
        fleet = SpotFleet(handle, config.cluster,
                          note=lambda kind, **info: fleet_log.append({"fleet": kind, **info}))
        pool = RequestPool(handle, [explore_spec(session, "chaos", seeds)], config.preemption,
                           store=store, warm_up=newcomer_warm_up(handle.client, config, store, 0))
        stage = tasks.stage_name(0, "chaos")
        killed: list[str] = []
        # Generous waits: a replacement starts a process and loads weights, which on a loaded
        # 2-core machine took over 120 s.
        while len(killed) < 2:
            # Wait for a new attempt to run, then for it to commit a step of its own: kill then.
            holder = wait_until(lambda: _holder(pool, exclude=killed), 300, "a new attempt")
            record = store.latents.commit_record(stage, REQUEST)
            before = -1 if record is None else record["step"]
            wait_until(lambda: (store.latents.commit_record(stage, REQUEST) or {"step": -1})
                       ["step"] > before, 300, "a committed step")
            assert not pool.done, "the request finished before it was preempted twice"
            assert fleet.preempt(holder, "kill")
            fleet.add(1)
            killed.append(holder)
        pool.wait(300)
        out = pool.close()["r"]

    summary = pool.summary()
    story = [{k: v for k, v in e.items() if k != "at"} for e in pool.log] + fleet_log
    assert summary["max_preemptions_of_one_request"] == 2, story
    assert summary["preemptions_hard"] == 2, story
    # Each replacement joined mid-stage: it loaded the weights, then pulled the request.
    assert len(summary["newcomer_ready_s"]) == 2, story
    warmed = {m["worker"] for m in pool.log if m["kind"] == "warming_up"}
    later = [m["worker"] for m in pool.log if m["kind"] == "assigned" and m["attempt"] > 1]
    assert len(later) == 2 and set(later) <= warmed, story
    assert summary["finished"] == 1
    np.testing.assert_array_equal(out.rewards, reference.rewards)
    run = RunStore.open(str(tmp_path / "run"), create=False)
    chaos = np.asarray(run.read_trajectory(stage, REQUEST))
    np.testing.assert_array_equal(chaos, np.asarray(run.read_trajectory("iter-0/clean", REQUEST)))
    assert len(run.latents.commit_record(stage, REQUEST)["resumes"]) == 2
    assert out.record["resumed_from"] > 0
    # The simulator's dispatcher, fed the events this live pool recorded (joins, kills,
    # progress, results), makes the same three assignments of the request the pool made.
    assigned = [{k: e[k] for k in ("request", "attempt", "worker", "resume_step")}
                for e in pool.log if e["kind"] == "assigned"]
    assert [a["attempt"] for a in assigned] == [1, 2, 3], story
    assert replay_decisions(pool.events) == assigned


def _holder(pool: RequestPool, exclude: list[str]) -> str | None:
    """The worker running request "r" now, if it is one not killed yet (read under the pool's
    lock: the pool's thread changes what it reads)."""
    with pool._lock:
        worker = pool.dispatcher.requests["r"].worker
        name = pool._addresses.get(worker) if worker else None
    return name if name and name not in exclude else None


def test_a_result_stranded_on_a_worker_killed_before_the_fetch_is_recomputed_elsewhere(
        tiny_run_yaml, tmp_path, monkeypatch):
    # The attempt finished, but its worker dies before the driver fetches the result: the pinned
    # key can never run again (Dask would wait for its worker for ever). The fetch gives up and
    # the request runs again on a fresh worker.
    monkeypatch.setattr(dispatch_glue, "_FETCH_TIMEOUT_S", 3.0)
    config = load_config(tiny_run_yaml)
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        fleet = SpotFleet(session.cluster, config.cluster)
        pool = RequestPool(session.cluster, [explore_spec(session, "stranded", np.arange(3))],
                           config.preemption, store=session.store)
        wait_until(lambda: pool._attempts, 120, "the first attempt")
        with pool._lock:   # the pool's loop cannot settle the attempt while this is held
            future = next(iter(pool._attempts))
            wait_until(lambda: future.status == "finished", 120, "the attempt to finish")
            holder = pool._addresses[pool.dispatcher.requests["r"].worker]
            assert fleet.preempt(holder, "kill")
            fleet.add(1)
            wait_until(lambda: not any(w.get("name") == holder for w in session.cluster.client
                                       .scheduler_info(n_workers=-1)["workers"].values()),
                       60, "the scheduler to drop the killed worker")
            pool._settle(future)   # what the loop does next: fetch the result
        assert pool.wait(180), "the request never finished after its result was lost"
        out = pool.close()
    assert [e["kind"] for e in pool.log].count("fetch_failed") == 1
    assert pool.summary()["finished"] == 1 and pool.summary()["attempts"] == 2
    assert out["r"].record["worker"] != holder


def test_a_sigterm_notice_hands_a_rollout_request_back_at_a_step_boundary_losing_no_step(
        tiny_run_yaml, tmp_path):
    # A rollout request (exploration's hand-back is the same helper; the chaos test sends
    # notices to exploration requests).
    from pipelines.run.rollout import RolloutChunk, rollout_chunk_task

    config = load_config(tiny_run_yaml, {"sampler.num_steps": 300,
                                         "cluster.spot_workers": 2})
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        store, handle = session.store, session.cluster
        fleet = SpotFleet(handle, config.cluster)
        chunk = RolloutChunk(0, 0, session.train_prompts[:1], np.arange(3)[None, :], 0)
        stage = tasks.stage_name(0, "rollout")
        pool = RequestPool(handle, [RequestSpec("r", rollout_chunk_task,
                                                (session.config, store, chunk), stage,
                                                chunk.name)], config.preemption, store=store)
        wait_until(lambda: store.latents.commit_record(stage, chunk.name), 300,
                   "a first commit")
        holder = wait_until(lambda: _holder(pool, exclude=[]), 300, "the request's worker")
        assert fleet.preempt(holder, "notice")
        pool.wait(300)
        out = pool.close()

    summary = pool.summary()
    story = [{k: v for k, v in e.items() if k != "at"} for e in pool.log]
    assert summary["preemptions_graceful"] == 1 and summary["preemptions_hard"] == 0, story
    assert "r" in out
    handback = [e for e in pool.log if e["kind"] == "requeued"]
    assert len(handback) == 1 and not handback[0]["hard"]
    # The attempt returned the step it had committed: the resumed attempt starts exactly there.
    resumed = [e for e in pool.log if e["kind"] == "assigned" and e["attempt"] == 2]
    assert resumed[0]["resume_step"] == handback[0]["step"] > 0
    assert out["r"].record["resumed_from"] == handback[0]["step"]
    assert any(e["kind"] == "notice" for e in pool.log)
    assert any(e["kind"] == "retired" for e in pool.log)


def test_chaos_trace_kills_real_workers_mid_run_and_the_run_equals_a_clean_one(
        tiny_run_yaml, tmp_path):
    trace = tmp_path / "chaos.csv"
    # Two spot nodes; one goes every 1.5 s (kill, notice, kill, ...), a fresh one follows.
    rows = ["0,add,n0", "0,add,n1"]
    alive, fresh = ["n0", "n1"], 2
    for i in range(12):
        rows.append(f"{1500 + 1500 * i},remove,{alive.pop(0)}")
        rows.append(f"{2000 + 1500 * i},add,n{fresh}")
        alive.append(f"n{fresh}")
        fresh += 1
    trace.write_text("\n".join(rows) + "\n")
    base = {"iterations": 2, "sampler.num_steps": 40, "cluster.spot_workers": 2,
            "exploration.candidates": 12}
    clean_cfg = load_config(tiny_run_yaml, base)
    chaos_cfg = load_config(tiny_run_yaml, {**base, "injector.trace": str(trace),
                                            "injector.action": "mixed"})
    with Session.from_config(clean_cfg, store=str(tmp_path / "clean")) as session:
        session.run(2)
    with Session.from_config(chaos_cfg, store=str(tmp_path / "chaos")) as session:
        session.run(2)
        injected = session.injector.summary()

    assert injected["kills"] >= 1, injected
    a = RunStore.open(str(tmp_path / "clean"), create=False)
    b = RunStore.open(str(tmp_path / "chaos"), create=False)
    wa, wb = a.load_checkpoint(2), b.load_checkpoint(2)
    for name, tensor in wa.weights.items():
        assert torch.equal(tensor, wb.weights[name]), name
    np.testing.assert_array_equal(a.open_rewards()["reward"].values,
                                  b.open_rewards()["reward"].values)
    # The run store's event log has every injection and every move of a request.
    logged = b.read_events()
    assert sum(e["kind"] == "injector" and e["what"] == "kill" for e in logged) \
        == injected["kills"]
    moves = [e for e in logged if e["kind"] == "request"]
    assert "assigned" in {e["what"] for e in moves}
    assert all(e["stage"] and e["at"] > 0 for e in moves)
    assert all(isinstance(e["step"], int) for e in moves if e["what"] == "requeued")
    assert not a.read_events() or all(e["kind"] != "injector" for e in a.read_events())
    for k in (1,):   # every planned candidate was explored, however often workers died
        info = b.stage_record(f"iter-{k}/explore")["info"]
        assert info["explored"] == info["planned"] and info["requests_cancelled"] == 0
    # The simulator's dispatcher, fed the event sequence this live pool recorded, makes the
    # same assignments. Whether a trace's kill finds its worker busy depends on the machine's
    # speed (on one no explore request moved); the test above moves one for certain.
    live = b.get_json(tasks.stage_name(1, "explore"), "candidates")["dispatch"]
    assigned = [{k: e[k] for k in ("request", "attempt", "worker", "resume_step")}
                for e in live["log"] if e["kind"] == "assigned"]
    assert assigned and replay_decisions(live["events"]) == assigned


def test_a_trace_that_removes_every_spot_worker_says_so_and_falls_back_to_random_seeds(
        tiny_run_yaml, tmp_path):
    # One node for one 5-minute tick, then none for a week, at 1 ms per trace second: the
    # node goes 0.3 s in, and the replay that would bring it back is 10 minutes away. (A trace
    # that ends at its last event replays at once: the node would come back every 0.3 s, and a
    # worker that starts fast explores in that window.)
    trace = tmp_path / "all-gone.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1] + [0] * 2016}))
    config = load_config(tiny_run_yaml, {"injector.trace": str(trace),
                                         "injector.time_scale": 0.001,
                                         "preemption.no_spot_wait_s": 2.0})
    events: list[tuple[str, dict]] = []
    with Session.from_config(config, store=str(tmp_path / "run"),
                             on_event=lambda kind, info: events.append((kind, info))) as session:
        wait_until(lambda: not session.cluster.workers_by_class()["spot"], 60, "the kill")
        history = session.run(2)
    said = [info for kind, info in events if kind == "dispatch"]
    assert [s["what"] for s in said] == ["starved", "gave_up"]
    assert "no spot worker for 2 s" in said[1]["reason"]
    assert any(kind == "injector" and info["kind"] == "no_spot_left" for kind, info in events)
    # Nothing was explored for iteration 1: its seeds are random, and the row says so.
    assert history.loc[0, "explored"] == 0
    assert history.loc[0, "filled"] == config.grpo.prompts_per_iteration * config.grpo.group_size


def test_a_frozen_worker_is_cut_off_by_its_silent_heartbeats_and_its_request_resumes(
        tiny_run_yaml, tmp_path):
    """A worker that stops answering (SIGSTOP: as behind a partition, its process alive) is
    found by the heartbeats the scheduler stops hearing -- committed-step progress is off
    here, and Dask itself would wait its worker TTL (5 minutes) -- and its request resumes on
    the other spot worker, computing what an undisturbed attempt computes."""
    config = load_config(tiny_run_yaml, {"sampler.num_steps": 300, "cluster.spot_workers": 2,
                                         "preemption.heartbeat_silence_s": 3,
                                         "preemption.liveness_steps": 0})
    seeds = np.arange(3)
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        store, client = session.store, session.cluster.client
        clean = RequestPool(session.cluster, [explore_spec(session, "clean", seeds)],
                            config.preemption, store=store)
        clean.wait(300)
        reference = clean.close()["r"]
        said = []   # what the console prints of the pool's events
        pool = RequestPool(session.cluster, [explore_spec(session, "frozen", seeds)],
                           config.preemption, store=store,
                           on_event=lambda kind, info: said.append(preemption_line(kind, info)))
        stage = tasks.stage_name(0, "frozen")
        wait_until(lambda: store.latents.commit_record(stage, REQUEST), 300, "a committed step")
        with pool._lock:
            frozen = pool.dispatcher.requests["r"].worker
        [pid] = client.run(os.getpid, workers=[frozen]).values()
        os.kill(pid, signal.SIGSTOP)
        try:
            assert pool.wait(300), "the frozen worker's request never finished elsewhere"
            out = pool.close()["r"]
        finally:
            os.kill(pid, signal.SIGCONT)
    silent = [e for e in pool.log if e["kind"] == "silent"]
    assert len(silent) == 1 and silent[0]["by"] == "heartbeat", pool.log
    [line] = [line for line in said if line and line.startswith("cut off:")]
    assert re.fullmatch(rf"cut off: {re.escape(silent[0]['worker'])} \(no heartbeat for \d+ s\); "
                        "its requests resume elsewhere from their last committed step", line)
    assert [e["worker"] for e in pool.log if e["kind"] == "worker_lost"] == \
        [silent[0]["worker"]], pool.log
    np.testing.assert_array_equal(out.rewards, reference.rewards)
    run = RunStore.open(str(tmp_path / "run"), create=False)
    np.testing.assert_array_equal(np.asarray(run.read_trajectory(stage, REQUEST)),
                                  np.asarray(run.read_trajectory("iter-0/clean", REQUEST)))
