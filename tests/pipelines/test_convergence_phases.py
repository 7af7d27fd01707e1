"""The convergence bench's job order: the cluster checks first, then every harness job, the
dearer modes first within a seed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import pipelines.bench.convergence as convergence
from pipelines.bench.convergence import longest_first, run_phases


def test_dearer_modes_start_first_and_keep_their_order_otherwise():
    assert longest_first(("vanilla", "sync", "stale")) == ["stale", "sync", "vanilla"]
    assert longest_first(("vanilla", "spotlight", "stale", "rlboost")) == \
        ["spotlight", "stale", "vanilla", "rlboost"]


def recorded_phases(monkeypatch) -> list:
    """What run_phases starts, in order: ("cluster", run) per cluster check, ("jobs", names)."""
    calls = []
    monkeypatch.setattr(convergence, "run_jobs", lambda plan, jobs, store, workers, on_done:
                        calls.append(("jobs", [j.name for j in jobs])))
    monkeypatch.setattr(convergence, "cluster_check", lambda plan, store, mode, seed, goal:
                        calls.append(("cluster", f"{mode}-seed{seed}")))
    return calls


def test_the_cluster_checks_run_first_then_every_job_in_one_pool_seed_by_seed(monkeypatch,
                                                                             tmp_path):
    calls = recorded_phases(monkeypatch)
    # The planned mode is not timed on the cluster: it plans on the stale run's measured time.
    store = SimpleNamespace(folder=tmp_path,
                            loaded={"cluster-stale-seed0": {"time_model": [30.0, 0.01, 9.0]}})
    run_phases(None, store, ("vanilla", "sync", "stale", "spotlight"), [0, 1, 2], [0], 2, 0.3,
               lambda: {})
    assert calls == [
        ("cluster", "vanilla-seed0"), ("cluster", "sync-seed0"), ("cluster", "stale-seed0"),
        ("jobs", [f"{m}-seed{s}" for s in range(3)
                  for m in ("stale", "spotlight", "sync", "vanilla")])]


def test_a_planned_mode_without_its_stale_mode_still_times_the_stale_cluster_run(monkeypatch,
                                                                               tmp_path):
    calls = recorded_phases(monkeypatch)
    store = SimpleNamespace(folder=tmp_path, loaded={"cluster-reuse-stale-seed0": {
        "time_model": [30.0, 0.01, 9.0]}})
    run_phases(None, store, ("nft-vanilla", "reuse-spotlight"), [0, 1], [0], 2, 0.3,
               lambda: {})
    assert calls == [
        ("cluster", "nft-vanilla-seed0"), ("cluster", "reuse-stale-seed0"),
        ("jobs", [f"{m}-seed{s}" for s in range(2) for m in ("reuse-spotlight", "nft-vanilla")])]


def test_the_planned_modes_need_the_stale_runs_measured_time(monkeypatch, tmp_path):
    monkeypatch.setattr(convergence, "run_jobs", lambda *a, **k: None)
    monkeypatch.setattr(convergence, "cluster_check", lambda *a: None)
    store = SimpleNamespace(folder=tmp_path, loaded={"cluster-stale-seed0": {"time_model": None}})
    with pytest.raises(RuntimeError, match="stale cluster run measured no exploration"):
        run_phases(None, store, ("stale", "spotlight"), [0], [0], 2, 0.3, lambda: {})


def test_a_time_model_saved_without_the_rollout_is_completed_from_the_stored_run(
        monkeypatch, tmp_path):
    """A stale cluster run saved before the sampled rollout's seconds were kept: its run store
    still holds the tasks, so the model is measured again from them and saved with the part."""
    from spotlight.config import RunConfig

    records = [{"stage": "rollout", "iteration": 0, "start": 0.0, "end": 7.0},
               {"stage": "train", "iteration": 0, "start": 7.0, "end": 15.0},
               {"stage": "explore", "iteration": 1, "start": 0.0, "end": 4.0, "samples": 4,
                "steps": 10}]
    opened = []
    monkeypatch.setattr(convergence.RunView, "open", lambda url: opened.append(url) or
                        SimpleNamespace(tasks=lambda: records))
    saved = {}
    store = SimpleNamespace(folder=tmp_path, loaded={"cluster-stale-seed0": {
        "time_model": [15.0, 0.1], "iteration_s": [15.0]}},
        save=lambda name, result: saved.update({name: result}))
    plan = SimpleNamespace(config=RunConfig())
    model = convergence.time_model(plan, store, "stale", 0, 0.3)
    assert model == (15.0, 0.1, 7.0)
    assert opened == [str(tmp_path / "runs" / "cluster-stale-seed0")]
    assert saved["cluster-stale-seed0"] == {"time_model": [15.0, 0.1, 7.0], "iteration_s": [15.0]}


def test_a_cluster_part_saved_before_its_stages_were_kept_gets_them_from_its_run(
        monkeypatch, tmp_path):
    """Its run's folder still holds the task records: the gpu path's seconds by stage are
    measured from them (the warm-up and validating iterations left out) and saved with the
    part; a part that has them, or whose run is not here, is left as it is."""
    records = [{"stage": stage, "iteration": k, "start": 10.0 * k + start, "end": 10.0 * k + end}
               for k in range(3) for stage, start, end in (("rollout", 0, 4), ("train", 4, 9))]
    monkeypatch.setattr(convergence.RunView, "open", lambda url: SimpleNamespace(
        tasks=lambda: records))
    old = {"iteration_s": [9.0, 9.0, 9.0], "validated": [False, False, True]}
    saved = {}
    store = SimpleNamespace(folder=tmp_path, loaded={
        "cluster-vanilla-seed0": old, "cluster-stale-seed0": dict(old),
        "cluster-sync-seed0": dict(old, stage_s={"train": 1.0})},
        save=lambda name, result: saved.update({name: result}))
    (tmp_path / "runs" / "cluster-vanilla-seed0").mkdir(parents=True)
    (tmp_path / "runs" / "cluster-vanilla-seed0" / "manifest.json").write_text("{}")
    for name in ("cluster-vanilla-seed0", "cluster-stale-seed0", "cluster-sync-seed0",
                 "cluster-absent-seed0"):
        convergence.keep_stage_seconds(store, name)
    assert saved == {"cluster-vanilla-seed0": dict(old, stage_s={"rollout": 4.0, "train": 5.0})}
