"""Experiment tracking: a real run's curves read back with each tracker's own reader.

One tiny run feeds every back-end at once (module fixture): two iterations, closed, resumed for
a third. TensorBoard's ``EventAccumulator``, MLflow's file store, wandb's offline run files and
trackio's local database must each hold the metrics of every step exactly once, with the values
the run store recorded. The cheap tests around it build a run store by hand.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from pipelines.front.session import Session
from pipelines.observe.metrics import ALWAYS, iteration_metrics, preemption_metrics
from pipelines.observe.tracking import tracking_observers
from pipelines.observe.validation_grid import grid_of, save_grid
from pipelines.run.records import stage_name
from pipelines.run.state import IterationResult
from spotlight.config import ConfigError, TrackingConfig, load_config
from spotlight.config import tracking as tracking_config
from storage import RunStore
from tests.pipelines.conftest import TINY_WORLD

pytestmark = pytest.mark.timeout(600)   # the first run of a session trains the tiny models
ALL = ["tensorboard", "wandb", "mlflow", "trackio"]
REWARD = TINY_WORLD["reward"]["name"]


@pytest.fixture(scope="module", autouse=True)
def tracker_homes(tmp_path_factory):
    """wandb's and trackio's own folders (settings, caches, trackio's database) in a temporary
    one: tests never touch the user's. trackio reads TRACKIO_DIR when it is first imported."""
    home = tmp_path_factory.mktemp("tracker-homes")
    mp = pytest.MonkeyPatch()
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "TRACKIO_DIR"):
        mp.setenv(var, str(home / var.lower()))
    for var in ("WANDB_MODE", "WANDB_API_KEY", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL",
                "MLFLOW_TRACKING_URI"):
        mp.delenv(var, raising=False)
    yield home
    mp.undo()


# --- readers: each tracker's own -----------------------------------------------------------------

def tensorboard_scalars(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
               for tag in acc.Tags()["scalars"]}
    return scalars, acc


def mlflow_scalars(folder: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=folder.resolve().as_uri())
    keys = client.get_run(run_id).data.metrics
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in keys}


def wandb_records(path: Path) -> list[bytes]:
    """The records of a wandb run file (LevelDB's log format after a 7-byte header)."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    out, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:   # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def wandb_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every history value of every offline run file under ``folder`` (a resumed run adds one)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        for data in wandb_records(path):
            record = pb.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                if isinstance(value, (int, float)) and not key.startswith("_"):
                    out.setdefault(key, []).append((step, float(value)))
    return out


def trackio_logs(project: str, run: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


# --- the run -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tracker_homes):
    """Two iterations with every tracker, closed; resumed for a third. The run store's results
    and the trackers' folder."""
    folder = tmp_path_factory.mktemp("tracked")
    path = folder / "tiny-run.yaml"
    path.write_text(yaml.safe_dump({**TINY_WORLD, "tracking": {"backends": ALL,
                                                                 "project": "spotlight-test"}}))
    url = str(folder / "run")
    with Session.from_config(load_config(path), store=url) as session:
        session.run(2)
    with Session.resume(url) as session:
        session.run(1)
        results = session.results
        store = session.store
        state = {name: store.get_json("tracking", name) for name in ALL}
    return SimpleNamespace(results=results, folder=folder / "run" / "tracking", state=state,
                           url=url)


def by_step(points: list[tuple[int, float]]) -> dict[int, float]:
    steps = [s for s, _ in points]
    assert len(steps) == len(set(steps)), f"a step logged twice: {sorted(steps)}"
    return dict(points)


def test_tensorboard_reads_back_every_metric_once_per_step(tracked_run):
    scalars, acc = tensorboard_scalars(tracked_run.folder / "tensorboard")
    results = tracked_run.results
    assert [r.iteration for r in results] == [0, 1, 2]
    named = set(ALWAYS) | {f"reward_{REWARD}", f"reward_std_{REWARD}", "approx_kl", "lr",
                           "eval_reward_avg", f"eval_reward_{REWARD}", "time/rollout_s",
                           "time/train_s", "time/validation_s", "time/explore_s",
                           "planner/candidates", "planner/steps", "fidelity/audit_tau"}
    assert named <= set(scalars), f"missing: {sorted(named - set(scalars))}"
    for tag in ALWAYS:
        assert sorted(by_step(scalars[tag])) == [0, 1, 2], tag
    rewards = by_step(scalars["reward_avg"])
    assert [rewards[k] for k in range(3)] == pytest.approx([r.reward_mean for r in results],
                                                           rel=1e-6)
    assert len(set(rewards.values())) == 3 and all(v > 0 for v in rewards.values()), \
        "the curves of a flat world prove nothing"
    assert by_step(scalars["lr"]) == pytest.approx({0: 3e-4, 1: 3e-4, 2: 3e-4})
    assert by_step(scalars["cost/total_usd"])[2] == pytest.approx(results[2].cost_total_usd,
                                                                  rel=1e-6)
    evals = by_step(scalars["eval_reward_avg"])
    assert sorted(evals) == [0, 1, 2, 3]   # the base model at 0, then after each iteration
    assert [evals[k + 1] for k in range(3)] == pytest.approx([r.val_reward for r in results],
                                                             rel=1e-6)
    images = acc.Images("eval_images")
    assert [e.step for e in images] == [0, 1, 2, 3] and images[0].width > 0
    prompts = acc.Tensors("eval_images/prompts/text_summary")
    assert "| image | prompt | reward |" in prompts[0].tensor_proto.string_val[0].decode()


def test_the_store_records_what_each_tracker_logged(tracked_run):
    for name, state in tracked_run.state.items():
        assert state["logged"] == 2, name
        assert state["run"], name


def test_mlflow_file_store_holds_the_same_values(tracked_run):
    tensorboard, _ = tensorboard_scalars(tracked_run.folder / "tensorboard")
    mlflow = mlflow_scalars(tracked_run.folder / "mlflow", tracked_run.state["mlflow"]["run"])
    assert set(mlflow) == set(tensorboard)
    for tag, points in tensorboard.items():
        assert by_step(mlflow[tag]) == pytest.approx(by_step(points), rel=1e-6), tag
    artifacts = list((tracked_run.folder / "mlflow").rglob("eval_images/step-*.png"))
    assert len(artifacts) == 4


def test_wandb_offline_runs_hold_the_same_values(tracked_run):
    tensorboard, _ = tensorboard_scalars(tracked_run.folder / "tensorboard")
    wandb = wandb_scalars(tracked_run.folder)
    assert len(list(tracked_run.folder.glob("wandb/offline-run-*"))) == 2   # run, then resumed
    assert set(tensorboard) <= set(wandb)
    for tag, points in tensorboard.items():
        assert by_step(wandb[tag]) == pytest.approx(by_step(points), rel=1e-6), tag
    assert len(list(tracked_run.folder.glob("wandb/offline-run-*/files/media/images/*"))) > 0


def test_trackio_local_store_holds_the_same_values(tracked_run):
    tensorboard, _ = tensorboard_scalars(tracked_run.folder / "tensorboard")
    logs = trackio_logs("spotlight-test", tracked_run.state["trackio"]["run"])
    trackio: dict[str, list[tuple[int, float]]] = {}
    for row in logs:
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "step":
                trackio.setdefault(key, []).append((row["step"], float(value)))
    for tag, points in tensorboard.items():
        assert by_step(trackio[tag]) == pytest.approx(by_step(points), rel=1e-6), tag
    tables = [row["eval_images"] for row in logs if "eval_images" in row]
    assert len(tables) == 4


# --- a run store made by hand: catching up, object stores, errors --------------------------------

def result(k: int) -> IterationResult:
    return IterationResult(iteration=k, mode="spotlight", reward_mean=0.1 * (k + 1),
                           group_reward_std=0.05, zero_std_groups=1, loss=0.5 - 0.1 * k,
                           kl_to_reference=0.01, clip_fraction=0.25, val_reward=0.3 + 0.1 * k,
                           explored=12, planned=12, filled=0, start=100.0 + 10 * k,
                           end=108.0 + 10 * k, cost_usd=0.01, cost_total_usd=0.01 * (k + 1),
                           audit_tau=0.5, plan_candidates=6, plan_steps=3, approx_kl=1e-3,
                           learning_rate=3e-4)


def record_iteration(store: RunStore, k: int, events: list[dict] = ()) -> None:
    """What the driver leaves in the store for iteration k (tasks, events, grid, record)."""
    tasks = [{"stage": "rollout", "worker": "gpu-0", "start": 100.0 + 10 * k,
              "end": 102.0 + 10 * k}, {"stage": "train", "worker": "gpu-0",
                                       "start": 103.0 + 10 * k, "end": 104.5 + 10 * k}]
    store.put_json(stage_name(k, "iteration"), "tasks", {"tasks": tasks})
    store.write_events(f"iter-{k:06d}-abcdef", list(events))
    images = np.random.default_rng(k).random((2, 3, 8, 8))
    if k == 0:
        save_grid(store, grid_of(0, images, np.array([0.0, 0.5]), ["12", "34"], 0.25))
        store.mark_stage_done("base-validation", {"kind": "validation", "record_version": 1,
                                                  "mean_reward": 0.25, "version": 0})
    save_grid(store, grid_of(k + 1, images, np.array([0.25, 0.75]), ["12", "34"],
                             result(k).val_reward))
    ledger = {"intervals": [{"worker": "gpu-0", "worker_class": "gpu", "start": 100.0,
                             "end": None},
                            {"worker": "spot-0", "worker_class": "spot", "start": 100.0,
                             "end": 104.0}]}
    store.mark_stage_done(stage_name(k, "iteration"), {
        "kind": "iteration", "record_version": 1, "result": result(k).to_record(),
        "ledger": ledger})


def hand_made_run(url: str, backends: list[str], iterations: int, **tracking):
    config = load_config(Path(__file__).parents[2] / "configs" / "digits.yaml",
                         {"tracking.backends": backends, **{f"tracking.{k}": v
                                                            for k, v in tracking.items()}})
    store = RunStore.open(url)
    for k in range(iterations):
        record_iteration(store, k)
    return SimpleNamespace(config=config, store=store)


def close_all(observers) -> None:
    for observer in observers:
        observer.close()


def test_a_resumed_run_catches_up_on_what_no_driver_logged(tmp_path):
    """A driver that died after recording iteration 1 but before logging it: the next one
    logs 1 (and 2 when it is done), never 0 again."""
    run = hand_made_run(str(tmp_path / "run"), ["tensorboard", "mlflow"], 1)
    close_all(tracking_observers(run))    # the first driver logged iteration 0 ...
    record_iteration(run.store, 1)        # ... and recorded 1, but died before logging it
    state = run.store.get_json("tracking", "mlflow")
    assert state["logged"] == 0
    observers = tracking_observers(run)   # the resumed driver: logs iteration 1 at once
    record_iteration(run.store, 2)
    for observer in observers:
        observer("iteration_done", {"iteration": 2})
    close_all(observers)
    scalars, _ = tensorboard_scalars(tmp_path / "run" / "tracking" / "tensorboard")
    assert sorted(by_step(scalars["reward_avg"])) == [0, 1, 2]
    assert by_step(scalars["eval_reward_avg"]) == pytest.approx({0: 0.25, 1: 0.3, 2: 0.4,
                                                                 3: 0.5})
    mlflow = mlflow_scalars(tmp_path / "run" / "tracking" / "mlflow", state["run"])
    assert by_step(mlflow["reward_avg"]) == pytest.approx({0: 0.1, 1: 0.2, 2: 0.3})


def test_an_object_store_run_keeps_its_event_files_in_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    run = hand_made_run("memory://tracked-object-store", ["tensorboard"], 2)
    close_all(tracking_observers(run))
    local = tmp_path / "cache" / "tracking" / "memory" / "tracked-object-store" / "tensorboard"
    names = sorted(p.name for p in local.iterdir())
    assert names and run.store.location.list_names("tracking", "tensorboard") == names
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in names:
        (copy / name).write_bytes(run.store.location.read_bytes("tracking", "tensorboard", name))
    scalars, _ = tensorboard_scalars(copy)
    assert by_step(scalars["reward_avg"]) == pytest.approx({0: 0.1, 1: 0.2})


def test_metrics_follow_flow_grpo_names_and_split_cost_by_class():
    ledger = {"intervals": [{"worker": "gpu-0", "worker_class": "gpu", "start": 0.0, "end": None},
                            {"worker": "spot-0", "worker_class": "spot", "start": 0.0,
                             "end": 1800.0}]}
    values = iteration_metrics(result(0).to_record(), reward="ocr", groups=4, beta_kl=0.5,
                               tasks=[], events=[], ledger=ledger,
                               prices={"gpu": 4.0, "spot": 1.0})
    assert values["reward_avg"] == values["reward_ocr"] == pytest.approx(0.1)
    assert values["zero_std_ratio"] == 0.25 and values["clipfrac"] == 0.25
    assert values["policy_loss"] == pytest.approx(0.5 - 0.5 * 0.01)
    assert values["approx_kl"] == 1e-3 and values["lr"] == 3e-4
    # at the iteration's end (t = 108 s): the gpu worker 108 s at $4/h, the spot one 108 s at $1/h
    assert values["cost/on_demand_usd"] == pytest.approx(108 * 4.0 / 3600)
    assert values["cost/spot_usd"] == pytest.approx(108 * 1.0 / 3600)
    assert "fidelity/kendall_tau" not in values   # not measured: left out, not logged as 0


def test_lost_steps_by_class():
    tasks = [{"stage": "explore", "first_step_at": 10.0, "last_step_at": 12.0, "steps": 5,
              "first_step": 1}]   # 0.5 s a step
    events = [
        {"kind": "preemptions", "summary": {"preemptions_hard": 1, "preemptions_graceful": 1,
                                            "gave_up": None}},
        {"kind": "request", "stage": "explore", "what": "assigned", "request": "a", "at": 20.0},
        {"kind": "request", "stage": "explore", "what": "requeued", "request": "a", "at": 23.0,
         "hard": True, "step": 2, "committed_at": 21.0},     # 2 s since its last commit
        {"kind": "request", "stage": "explore", "what": "handed_back", "request": "b",
         "at": 25.0, "step": 3, "computed_step": 5},         # 2 computed past the commit
    ]
    values = preemption_metrics(events, tasks)
    assert values == {"spot/preemptions_hard": 1, "spot/preemptions_graceful": 1,
                      "spot/gave_up": 0, "spot/lost_steps_hard": pytest.approx(4.0),
                      "spot/lost_steps_graceful": 2}


def test_an_unknown_tracker_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"'tensorbord', which is not a tracker; did you mean "
                                          r"'tensorboard'.*pip install -e '\.\[tracking\]'"):
        TrackingConfig(backends=["tensorbord"])
    with pytest.raises(ConfigError, match=r"\['wandb'\] more than once"):
        TrackingConfig(backends=["wandb", "wandb"])


def test_a_tracker_whose_package_is_missing_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(tracking_config.TRACKERS, "wandb", ("spotlight_no_such_tracker", "wandb"))
    with pytest.raises(ConfigError, match=r"tracking.backends names 'wandb', but its package "
                                          r"'wandb' is not installed; install the trackers with "
                                          r"pip install -e '.\[tracking\]' in the Spotlight "
                                          r"checkout"):
        load_config(Path(__file__).parents[2] / "configs" / "digits.yaml",
                    {"tracking.backends": ["tensorboard", "wandb"]})


def test_offline_trackio_refuses_a_remote_destination_before_the_run_starts(monkeypatch):
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/somewhere")
    with pytest.raises(ConfigError, match="tracking.offline is true, but TRACKIO_SPACE_ID is set"):
        load_config(Path(__file__).parents[2] / "configs" / "digits.yaml",
                    {"tracking.backends": ["trackio"]})
