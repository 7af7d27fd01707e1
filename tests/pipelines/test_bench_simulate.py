"""bench simulate's validation step on a real run store: the recorded iterations of a tiny
spotlight run on the embedded cluster are read back and replayed through the simulator."""
from __future__ import annotations

import math

import pytest

from pipelines.bench.simulate import recorded_run, validation
from pipelines.front.session import Session

pytestmark = pytest.mark.timeout(600)


def test_a_measured_run_is_read_back_and_replayed(tiny_run_config, tmp_path):
    config = tiny_run_config.with_values({"validation.every": 1000})
    url = str(tmp_path / "measured")
    with Session.from_config(config, store=url, mode="spotlight") as session:
        session.run(4)   # a warm-up, two compared, a validated last one
    iterations, facts = recorded_run(url)
    assert len(iterations) == 4
    assert (facts["mode"], facts["gpu_workers"], facts["spot_workers"]) == ("spotlight", 1, 1)
    stages = {t["stage"] for it in iterations for t in it.tasks}
    assert {"rollout", "train", "explore"} <= stages
    # Each recorded iteration lasted at least as long as its own critical-path tasks.
    for it in iterations:
        chain = [t["end"] - t["start"] for t in it.tasks if t["worker"].startswith("gpu")]
        assert it.wall_s >= sum(chain) * 0.999
    check = validation([url])
    compared = check["runs"][0]["iterations"]
    assert compared == 2 and math.isfinite(check["error"])
    assert check["driver_s_per_stage"] > 0
    assert 0 < check["simulated_s"] <= check["measured_s"] * 1.5


def test_a_folder_without_a_run_is_named(tmp_path):
    with pytest.raises(ValueError, match="--run .*nothing-here.*no Spotlight run"):
        recorded_run(str(tmp_path / "nothing-here"))
