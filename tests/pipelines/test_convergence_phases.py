"""The convergence bench's job order: the cluster checks first, then every harness job, the
dearer modes first within a seed."""
from __future__ import annotations

from types import SimpleNamespace

import pipelines.bench.convergence as convergence
from pipelines.bench.convergence import longest_first, run_phases


def test_dearer_modes_start_first_and_keep_their_order_otherwise():
    assert longest_first(("vanilla", "sync", "spotlight")) == ["spotlight", "sync", "vanilla"]
    assert longest_first(("vanilla", "planned", "spotlight", "rlboost")) == \
        ["planned", "spotlight", "vanilla", "rlboost"]


def test_the_cluster_checks_run_first_then_every_job_in_one_pool_seed_by_seed(monkeypatch):
    calls = []
    monkeypatch.setattr(convergence, "run_jobs", lambda plan, jobs, store, workers, on_done:
                        calls.append(("jobs", [j.name for j in jobs])))
    monkeypatch.setattr(convergence, "cluster_check", lambda plan, store, mode, seed, goal:
                        calls.append(("cluster", f"{mode}-seed{seed}")))
    run_phases(None, SimpleNamespace(loaded={}), ("vanilla", "sync", "spotlight"), [0, 1, 2], [0],
               2, 0.3, lambda: {})
    assert calls == [
        ("cluster", "vanilla-seed0"), ("cluster", "sync-seed0"), ("cluster", "spotlight-seed0"),
        ("jobs", [f"{m}-seed{s}" for s in range(3) for m in ("spotlight", "sync", "vanilla")])]
