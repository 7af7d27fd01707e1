"""The in-process executor of the iteration program: what it refuses, that each mode takes its
seeds where the cluster does, and that it computes what the Dask driver computes, bit for bit, on
moving weights (the one test that runs both executors of the program)."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.run.inprocess import InProcessRun
from pipelines.run.records import stage_name
from spotlight.config import ConfigError
from spotlight.iteration import TimeModel


def test_settings_that_depend_on_timing_are_refused(tiny_run_config):
    with pytest.raises(ConfigError, match="planner.enabled: false"):
        InProcessRun(tiny_run_config.with_values({"planner.enabled": True}), "spotlight")
    with pytest.raises(ConfigError, match="exploration.deadline: false"):
        InProcessRun(tiny_run_config.with_values({"exploration.deadline": True}), "spotlight")
    with pytest.raises(ConfigError, match="in-process mode 'fresh'"):
        InProcessRun(tiny_run_config, "fresh")


@pytest.mark.parametrize("mode, sources", [("spotlight", ["random", "explore", "explore"]),
                                           ("sync", ["sync", "sync", "sync"]),
                                           ("vanilla", ["random", "random", "random"])])
def test_each_mode_takes_its_seeds_where_the_cluster_does(tiny_run_config, mode, sources):
    config = tiny_run_config.with_values({"fidelity.audit_every": 2})
    harness = InProcessRun(config, mode)
    try:
        run = harness.run_iterations(3)
    finally:
        harness.close()
    assert [it.source for it in run.iterations] == sources
    assert [it.iteration for it in run.iterations] == [0, 1, 2]
    assert all(it.val_reward is not None for it in run.iterations)   # validation.every: 1
    assert harness.store.latest_checkpoint() == 3
    # Spotlight audits iteration 2's stale candidates with θ_2: a τ (or None if all tied).
    assert run.iterations[1].audit_tau is None
    if mode != "spotlight":
        assert all(it.audit_tau is None for it in run.iterations)


def test_staleness_probe_ranks_the_same_candidates_with_older_weights(tiny_run_config,
                                                                     monkeypatch):
    """τ per lag compares θ_k's scores of iteration k's candidates with θ_k-lag's. The tiny
    model scores every candidate 0 (all tied), so the scores here are made up per version:
    θ_2 and θ_1 rank alike, θ_0 in reverse."""
    harness = InProcessRun(tiny_run_config, "vanilla")
    calls = []

    def explore(iteration, version, candidates, stage, prompts):
        calls.append((iteration, version, candidates, stage, len(prompts)))
        order = np.arange(candidates, dtype=float)
        scores = -order if version == 0 else order
        return [(list(range(candidates)), list(scores)) for _ in prompts]

    monkeypatch.setattr(harness, "explore", explore)
    try:
        taus = harness.staleness_taus(2, [1, 2, 4], prompts=2, candidates=8)
    finally:
        harness.close()
    assert taus == {1: 1.0, 2: -1.0, 4: None}    # θ_-2 does not exist
    assert calls == [(2, 2, 8, "audit", 2), (2, 1, 8, "audit", 2), (2, 0, 8, "audit", 2)]


def test_the_planner_plans_on_modelled_time(tiny_run_config):
    """With planner.enabled the harness plans each exploration from a TimeModel: a wide window
    explores every prompt with the arm the planner picks (and pays it); a window too short for
    one prompt explores nothing and the rollout takes random seeds."""
    config = tiny_run_config.with_values({"planner.enabled": True, "planner.candidates": [6, 8],
                                          "planner.steps": [0]})
    with pytest.raises(ConfigError, match="TimeModel"):
        InProcessRun(config, "spotlight")
    wide = InProcessRun(config, "spotlight", time_model=TimeModel(60.0, 1e-3, spot_slots=2))
    narrow = InProcessRun(config, "spotlight", time_model=TimeModel(1e-4, 1e-3))
    try:
        wide_run, narrow_run = wide.run_iterations(4), narrow.run_iterations(2)
    finally:
        wide.close()
        narrow.close()
    prompts, steps = config.grpo.prompts_per_iteration, config.sampler.num_steps
    # Both arms fit the wide window; billed spot time costs the same whichever runs, so N 8
    # (more candidates, same steps) dominates N 6, which is never tried. Every prompt, at the
    # rollout's steps.
    assert [it.plan for it in wide_run.iterations] == [(8, steps, prompts)] * 3 + [None]
    assert sum(wide.program.planner.pulls) == 3   # the plans of iterations 1, 2 and 3 were paid
    explored = wide.store.get_json(stage_name(3, "explore"), "candidates")["seeds"]
    assert [len(seeds) for seeds in explored] == [8] * prompts
    assert narrow_run.iterations[0].plan[0] == 0   # nothing fits the window: nothing explored
    assert not narrow.log.done(1, "explore")
    assert narrow_run.iterations[1].source == "random"
    assert sum(narrow.program.planner.pulls) == 0


def test_a_stopped_run_ran_the_full_runs_iterations(tiny_run_config):
    """``stop`` ends the run at a validation; what ran is the full run's prefix (the budget, not
    the stop, decides that iteration 0 explores iteration 1)."""
    runs = []
    for stop in (None, lambda run: len(run.iterations) == 2):
        harness = InProcessRun(tiny_run_config, "spotlight")
        try:
            runs.append(harness.run_iterations(3, stop=stop))
        finally:
            harness.close()
    full, stopped = runs
    assert [it.iteration for it in stopped.iterations] == [0, 1]
    assert stopped.iterations == full.iterations[:2]
    assert [it.source for it in stopped.iterations] == ["random", "explore"]


@pytest.mark.timeout(900)
def test_the_in_process_run_and_the_cluster_compute_the_same_iterations(tiny_run_config, tmp_path,
                                                                 monkeypatch):
    """Two spotlight iterations both ways, with an audit in the second: the same stale
    candidates, the same selected seeds, the same rollout rewards, the same τ, the same
    weights. The tiny world's rewards differ within every group (its fixture checks), so
    equal here means computed alike, not zero alike."""
    import torch

    from pipelines.front.session import Session
    from storage import RunStore

    config = tiny_run_config.with_values({"fidelity.audit_every": 1, "fidelity.audit_prompts": 2,
                                          "fidelity.audit_candidates": 3})
    reads = []
    get_json = RunStore.get_json

    def counted(store, stage, name):
        reads.append((stage, name))
        return get_json(store, stage, name)

    monkeypatch.setattr(RunStore, "get_json", counted)
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        session.run(2)
        # The driver wrote every candidates.json of this run: it never reads one back.
        assert [r for r in reads if r[1] == "candidates"] == []
        cluster = recorded(session.store)
    inprocess = InProcessRun(config, "spotlight", base_val_reward=0.0)
    try:
        run = inprocess.run_iterations(2)
        ours = recorded(inprocess.store)
    finally:
        inprocess.close()
    # Candidates, seeds and audit are laid out alike by both executors (pipelines.run.recording)
    for name in ("candidates", "seeds", "audit"):
        assert ours[name] == cluster[name], name
    for k in (0, 1):
        np.testing.assert_array_equal(ours["rewards"][k], cluster["rewards"][k])
    # The audit re-scores with θ_1: as training left it in process, as a spot worker loaded it
    # from the checkpoint. Equal only if both mark the same parameters trainable (a frozen
    # prompt encoder runs other kernels: ~1e-9 apart before mark_trainable).
    assert cluster["audit"]["kendall_tau"] is not None
    assert run.iterations[1].audit_tau == cluster["audit"]["kendall_tau"]
    assert all(torch.equal(ours["weights"][name], cluster["weights"][name])
               for name in ours["weights"])


def recorded(store) -> dict:
    """What a run of two iterations recorded, as the comparison reads it."""
    candidates = store.get_json(stage_name(1, "explore"), "candidates")
    audit = store.get_json(stage_name(1, "audit"), "audit")
    return {"candidates": {k: candidates[k] for k in ("seeds", "rewards")},
            "seeds": store.get_json(stage_name(1, "selection"), "selection")["seeds"],
            "rewards": [store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
                        for k in (0, 1)],
            "audit": {k: audit[k] for k in ("seeds", "prompt_index", "stale", "fresh",
                                            "kendall_tau")},
            "weights": store.load_checkpoint(2).weights}
