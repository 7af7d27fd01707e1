"""The stage log and the typed stage results, against an in-memory run store."""
from __future__ import annotations

import uuid

import pytest

from pipelines.run.stage_log import StageLog
from pipelines.run.stages import (
    RESULT_TYPES,
    AuditResult,
    ExploreResult,
    IterationRecord,
    PlanResult,
    RewardResult,
    RolloutResult,
    SelectionResult,
    Stage,
    StageRecordError,
    TrainResult,
    ValidationResult,
    read_result,
)
from spotlight.exploration.planner import Plan
from storage import RunStore


@pytest.fixture
def store():
    return RunStore.open(f"memory://stage-log/{uuid.uuid4().hex}", writer=True)


def _plan() -> Plan:
    return Plan(3, 8, 4, 2, 12.5, 30.0, 2, "bandit")


EXAMPLES = {
    "plan": PlanResult.of(_plan(), 1700.0),
    "explore": ExploreResult(explored=16, planned=16, requests_finished=4, preemptions=1),
    "explore-sync": ExploreResult(explored=8, planned=8, requests_finished=2),
    "selection": SelectionResult("explore"),
    "audit": AuditResult(0.25),
    "rollout": RolloutResult({"stage": "rollout", "start": 1.0, "end": 2.0}),
    "reward": RewardResult(0.5, {"stage": "reward"}),
    "train": TrainResult({"loss": 0.1, "kl_to_reference": 0.0, "clip_fraction": 0.0}, None),
    "validation": ValidationResult(0.4, 3, None),
    "base-validation": ValidationResult(0.2, 0, None),
    "iteration": IterationRecord({"iteration": 2, "end": 5.0}, {"workers": {}}),
}


def test_every_stage_has_an_example():
    assert set(EXAMPLES) == set(RESULT_TYPES)


@pytest.mark.parametrize("stage", sorted(EXAMPLES))
def test_a_result_round_trips_through_the_manifest(store, stage):
    log = StageLog(store)
    iteration = None if stage == "base-validation" else 2
    log.record(iteration, stage, EXAMPLES[stage])
    reopened = StageLog(RunStore.open(store.url, create=False))   # a resumed driver
    assert reopened.get(iteration, stage) == EXAMPLES[stage]
    record = store.stage_record(stage if iteration is None else f"iter-2/{stage}")["info"]
    assert record["kind"] == type(EXAMPLES[stage]).KIND and record["record_version"] == 1


def test_the_plan_comes_back_as_a_plan(store):
    log = StageLog(store)
    log.record(4, "plan", PlanResult.of(_plan(), 1.0))
    assert log.get(4, "plan").as_plan == _plan()


def test_once_runs_a_stage_only_when_it_is_not_recorded(store):
    calls = []

    def run():
        calls.append(1)
        return AuditResult(0.5)

    log = StageLog(store)
    assert log.once(0, "audit", run) == (AuditResult(0.5), False)
    assert log.once(0, "audit", run) == (AuditResult(0.5), True)
    assert StageLog(store).once(0, "audit", run) == (AuditResult(0.5), True)
    assert calls == [1]


def test_a_failing_stage_records_nothing(store):
    log = StageLog(store)

    def run():
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        log.once(1, "train", run)
    assert not log.done(1, "train") and store.stage_record("iter-1/train") is None


def test_the_log_reads_the_manifest_once_and_then_knows_it(store):
    log = StageLog(store)
    reads = store.manifest.reads
    for k in range(5):
        log.record(k, "audit", AuditResult(None))
        assert log.done(k, "audit") and not log.done(k, "train")
        log.get(k, "audit")
    assert store.manifest.reads == reads   # the writer knows what it wrote


def test_a_reader_log_reads_once_per_refresh():
    url = f"memory://stage-log/{uuid.uuid4().hex}"
    writer = StageLog(RunStore.open(url, writer=True))
    writer.record(0, "audit", AuditResult(0.1))
    reader_store = RunStore.open(url, create=False)
    reads = reader_store.manifest.reads
    reader = StageLog(reader_store)
    for _ in range(10):
        reader.done(0, "audit"), reader.get(0, "audit"), reader.done(0, "train")
    assert reader_store.manifest.reads == reads + 1
    writer.record(0, "train", TrainResult({}, None))
    assert not reader.done(0, "train")
    reader.refresh()
    assert reader.done(0, "train") and reader_store.manifest.reads == reads + 2


def test_completed_iterations_counts_the_recorded_prefix(store):
    log = StageLog(store)
    for k in (0, 1, 3):
        log.record(k, "iteration", EXAMPLES["iteration"])
    assert log.completed_iterations() == 2


def test_a_record_of_the_wrong_type_is_refused(store):
    with pytest.raises(TypeError, match="records a TrainResult, got AuditResult"):
        StageLog(store).record(0, "train", AuditResult(0.1))
    assert store.stage_record("iter-0/train") is None


def test_an_unknown_stage_names_the_known_ones(store):
    with pytest.raises(StageRecordError, match="no stage named 'trian'.*'train'"):
        StageLog(store).record(0, "trian", AuditResult(0.1))


def test_a_newer_record_is_refused_with_what_to_do(store):
    store.mark_stage_done("iter-0/train", {"kind": "train", "record_version": 99,
                                            "stats": {}})
    with pytest.raises(StageRecordError, match="version 99, newer.*upgrade Spotlight"):
        StageLog(store).get(0, "train")


def test_a_record_of_another_kind_is_refused(store):
    store.mark_stage_done("iter-0/train", AuditResult(0.3).to_record())
    with pytest.raises(StageRecordError, match="'audit' result, expected 'train'"):
        StageLog(store).get(0, "train")


def test_records_from_before_kinds_read_as_version_one():
    legacy = {"stats": {"loss": 0.2}, "task": {"stage": "train"}}
    assert read_result("train", legacy) == TrainResult({"loss": 0.2}, {"stage": "train"})
    old_iteration = {"result": {"iteration": 0}, "ledger": {}, "planner": {"a": 1},
                     "monitor": {"b": 2}}
    assert read_result("iteration", old_iteration).planner == {"a": 1}
    old_selection = {"source": "explore", "selection": {"seeds": [[1, 2]]}}
    assert read_result("selection", old_selection).selection == {"seeds": [[1, 2]]}


def test_every_stage_records_a_result_type_and_an_unknown_stage_is_an_error(tmp_path):
    assert set(RESULT_TYPES) == set(Stage)
    assert f"iter-3/{Stage.EXPLORE_SYNC}" == "iter-3/explore-sync" == f"iter-3/{'explore-sync'}"
    log = StageLog(RunStore.open(str(tmp_path / "run")))
    assert not log.done(0, Stage.ROLLOUT) and not log.done(0, "rollout")
    with pytest.raises(StageRecordError, match="no stage named 'rollot'"):
        log.done(0, "rollot")
