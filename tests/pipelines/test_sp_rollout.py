"""The RL iteration's rollout on SP groups (parallel.size_classes): the same trajectory,
log-probabilities, rewards and trained weights as on single workers, also when a group member
is SIGKILLed mid-request."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pipelines.front.session import Session
from pipelines.run.rollout_store import read_rollout
from spotlight.config import load_config
from tests.pipelines.conftest import write_tiny_world

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

SP = {"model.num_attention_heads": 2, "cluster.gpu_workers": 2, "grpo.request_prompts": 1,
      "sampler.num_steps": 12, "mode": "vanilla"}


@pytest.fixture(scope="module")
def run_yaml(tmp_path_factory, tiny_world_learns):
    return write_tiny_world(tmp_path_factory.mktemp("sp-runs"))


@pytest.fixture(scope="module")
def alone(run_yaml, tmp_path_factory):
    """One iteration with the rollout and training on single gpu workers."""
    return _iteration(run_yaml, str(tmp_path_factory.mktemp("alone") / "run"), sp=False)


@pytest.fixture(scope="module")
def grouped(run_yaml, tmp_path_factory):
    """The same iteration with the rollout on an SP pair, uninterrupted."""
    return _iteration(run_yaml, str(tmp_path_factory.mktemp("sp") / "run"), sp=True)


def _iteration(yaml_path, url, sp: bool, during=None, data_parallel: bool = False):
    config = load_config(yaml_path, {**SP, **({"parallel.size_classes": ["12x32:2"]} if sp
                                              else {}),
                                     "parallel.data_parallel": data_parallel})
    with Session.from_config(config, store=url, mode="vanilla") as session:
        watcher = threading.Thread(target=during, args=(session,), daemon=True) if during \
            else None
        if watcher:
            watcher.start()
        session.run(1)
        store = session.store
        names = sorted(store.requests("iter-0/rollout"))
        latents = np.concatenate([np.asarray(store.read_trajectory("iter-0/rollout", n))
                                  for n in names], axis=1)
        record = store.stage_record("iter-0/rollout")["info"]
        tasks = store.get_json("iter-0/iteration", "tasks")["tasks"]
        return {"rewards": store.get_arrays("iter-000000/reward", "reward")["rewards"],
                "log_probs": read_rollout(store, "iter-0/rollout")[0],
                "latents": latents, "weights": store.load_checkpoint(1).weights,
                "names": names, "record": record, "tasks": tasks,
                "rollouts": [t for t in tasks if t["stage"] == "rollout"]}


def _same(a: dict, b: dict, atol: float) -> None:
    for key in ("rewards", "log_probs", "latents"):
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=atol, err_msg=key)
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:
        np.testing.assert_allclose(a["weights"][name].numpy(), b["weights"][name].numpy(),
                                   rtol=0, atol=atol, err_msg=name)


def test_an_sp_rollout_equals_the_single_worker_rollout(alone, grouped):
    _same(alone, grouped, atol=1e-5)
    assert np.abs(grouped["log_probs"]).sum() > 0
    assert grouped["names"] == ["p0000", "p0001"]
    sp = grouped["record"]["sp"]
    assert sp["requests"] == 2 and sp["losses"] == 0 and len(sp["groups"]) == 1
    assert len(sp["groups"][0]) == 2   # one group of both gpu workers
    assert {t["sp_degree"] for t in grouped["rollouts"]} == {2}
    assert "sp" not in (alone["record"] or {}) or alone["record"]["sp"] is None


def test_a_member_killed_mid_request_regroups_and_the_request_resumes(run_yaml, grouped,
                                                                       tmp_path):
    """SIGKILL one gpu worker while a request is under way (4 or more of its steps committed,
    not near its end): the survivors regroup, that request resumes from its committed steps,
    and the iteration equals the uninterrupted SP run."""
    from pipelines.parallel.groups import kill_executors
    from storage import RunStore

    url = str(tmp_path / "cut")
    killed: list[tuple[str, int]] = []   # (request, its committed step at the kill)

    def kill_mid_request(session) -> None:
        deadline = time.monotonic() + 120
        steps = SP["sampler.num_steps"]
        while time.monotonic() < deadline and not killed:
            groups = session.driver.carried.sp_groups
            store = RunStore.open(url, create=False) if groups else None
            for name in ("p0000", "p0001") if store else ():
                point = store.resume_point("iter-0/rollout", name)
                if point is not None and 4 <= point.step < steps - 2:   # under way
                    kill_executors(groups.client, [sorted(groups.membership.executors)[-1]])
                    killed.append((name, point.step))
                    break
            time.sleep(0.005)

    cut = _iteration(run_yaml, url, sp=True, during=kill_mid_request)
    assert killed, "the request finished before the kill: lengthen it"
    _same(grouped, cut, atol=0)   # bit for bit: resumed from committed steps
    sp = cut["record"]["sp"]
    assert sp["losses"] >= 1 and sp["attempts"] > sp["requests"]
    name, step = killed[0]
    assert sp["resumed_from"].get(name, 0) >= step   # from its committed steps, not from 0



def test_data_parallel_training_beside_sp_groups_takes_the_single_worker_step(run_yaml, alone,
                                                                               tmp_path):
    """Both gpu workers train (parallel.data_parallel) right after serving the rollout as an SP
    pair: two communicators in each process. The step is the single worker's -- the summed
    gradients equal its gradients to float rounding (tests/parallel/test_data_parallel.py), and
    Adam's first step moves each weight by about lr, so a rounding-level gradient difference
    moves a weight by at most ~2 lr."""
    both = _iteration(run_yaml, str(tmp_path / "both"), sp=True, data_parallel=True)
    trains = [t for t in both["tasks"] if t["stage"] == "train"]
    assert [t.get("data_parallel") for t in trains] == [2]
    np.testing.assert_allclose(alone["rewards"], both["rewards"], rtol=0, atol=1e-5)
    lr = 3e-4
    moved = max(float(np.abs(alone["weights"][n].numpy() - both["weights"][n].numpy()).max())
                for n in alone["weights"])
    assert moved <= 2 * lr + 1e-6
    same = np.mean([np.allclose(alone["weights"][n].numpy(), both["weights"][n].numpy(),
                                rtol=0, atol=1e-6) for n in alone["weights"]])
    assert same >= 0.5, same   # most tensors match to rounding
