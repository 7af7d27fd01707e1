"""A crash right after any stage is recorded resumes at the next one, and the finished run equals
one that never crashed: weights, every reward row, the seeds rolled out."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.front.session import Session
from pipelines.run.stage_log import StageLog

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
ITERATIONS = 2
# One crash point per way a resumed iteration goes on: exploration planned but not run, rollout
# and reward recorded (the rollout is read back), next seeds explored but not selected, the
# audit recorded mid-iteration. (Weights committed, training skipped: the driver SIGKILL test
# in test_session.py; "skip if recorded" for every stage: test_stage_log.py.)
CRASH_AFTER = ["iter-0/reward", "iter-1/audit"]   # two of the four kinds (suite time)


class Crash(Exception):
    """Stands for the driver dying right after a stage was recorded."""


def _fingerprint(store) -> dict:
    weights = store.load_checkpoint(ITERATIONS).weights
    rewards = store.open_rewards()
    return {"weights": {k: v.clone() for k, v in weights.items()},
            "reward": np.asarray(rewards["reward"].values),
            "seed": np.asarray(rewards["seed"].values),
            "selection": [store.get_json(f"iter-{k}/selection", "selection")["seeds"]
                          for k in range(ITERATIONS)]}


@pytest.fixture(scope="module")
def clean(tiny_run_config_module, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("clean") / "run")
    with Session.from_config(tiny_run_config_module, store=url) as session:
        session.run(ITERATIONS)
        return _fingerprint(session.store)


@pytest.fixture(scope="module")
def tiny_run_config_module(tmp_path_factory, tiny_world_learns):
    import yaml

    from spotlight.config import load_config
    from tests.pipelines.conftest import TINY_WORLD

    run = dict(TINY_WORLD, fidelity={"audit_every": 1, "audit_prompts": 2, "audit_candidates": 3})
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(run))
    return load_config(path)


def test_a_crash_after_any_stage_resumes_to_the_same_run(clean, tiny_run_config_module, tmp_path,
                                                          monkeypatch):
    record = StageLog.record
    for n, stage in enumerate(CRASH_AFTER):
        url = str(tmp_path / f"run-{n}")

        def crashing_record(self, iteration, name, result, _stage=stage):
            record(self, iteration, name, result)
            if f"iter-{iteration}/{name}" == _stage:
                raise Crash(_stage)

        monkeypatch.setattr(StageLog, "record", crashing_record)
        with Session.from_config(tiny_run_config_module, store=url) as session:
            with pytest.raises(Crash):
                session.run(ITERATIONS)
        monkeypatch.setattr(StageLog, "record", record)
        with Session.resume(url) as session:
            assert session.store.stage_record(stage) is not None   # it was recorded, once
            session.run(ITERATIONS - session.completed_iterations())
            resumed = _fingerprint(session.store)
        for name, tensor in clean["weights"].items():
            assert torch.equal(tensor, resumed["weights"][name]), (stage, name)
        np.testing.assert_array_equal(resumed["reward"], clean["reward"], err_msg=stage)
        np.testing.assert_array_equal(resumed["seed"], clean["seed"], err_msg=stage)
        assert resumed["selection"] == clean["selection"], stage
