"""The in-process harness: what it refuses, and that each mode takes its seeds where the cluster
does. That it computes the cluster's numbers bit for bit is test_digits_pin's."""
from __future__ import annotations

import pytest

from pipelines.run.harness import Harness
from spotlight.config import ConfigError


def test_settings_that_depend_on_timing_are_refused(tiny_run_config):
    with pytest.raises(ConfigError, match="planner.enabled: false"):
        Harness(tiny_run_config.with_values({"planner.enabled": True}), "spotlight")
    with pytest.raises(ConfigError, match="exploration.deadline: false"):
        Harness(tiny_run_config.with_values({"exploration.deadline": True}), "spotlight")
    with pytest.raises(ConfigError, match="harness mode 'fresh'"):
        Harness(tiny_run_config, "fresh")


@pytest.mark.parametrize("mode, sources", [("spotlight", ["random", "explore", "explore"]),
                                           ("sync", ["sync", "sync", "sync"]),
                                           ("vanilla", ["random", "random", "random"])])
def test_each_mode_takes_its_seeds_where_the_cluster_does(tiny_run_config, mode, sources):
    config = tiny_run_config.with_values({"fidelity.audit_every": 2})
    harness = Harness(config, mode)
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
