"""The typed, versioned results the driver's stages record in the run manifest.

Each stage of an iteration writes its bulk data (arrays, candidate lists, latents) to the run
store first and then records one small result here; ``--resume`` reads the same object back
instead of recomputing the stage. A record carries its ``kind`` and ``record_version``: one from
a newer Spotlight is refused with an error, and one from before records were typed (no
``kind``) is read as version 1, whose fields it has.

A result holds only what stays small however long the run grows: the manifest is rewritten as
one object on every record.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from spotlight.exploration.planner import Plan


class Stage(str, Enum):
    """The stages a run records, by the name their records and store folders carry (a stage
    is a ``str``: ``f"iter-3/{Stage.ROLLOUT}"`` is ``iter-3/rollout``)."""

    PLAN = "plan"
    EXPLORE = "explore"
    EXPLORE_SYNC = "explore-sync"
    SELECTION = "selection"
    AUDIT = "audit"
    ROLLOUT = "rollout"
    REWARD = "reward"
    TRAIN = "train"
    VALIDATION = "validation"
    BASE_VALIDATION = "base-validation"
    ITERATION = "iteration"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class StageRecordError(ValueError):
    """A stage record this code cannot read (another stage's kind, a newer version)."""


@dataclass(frozen=True)
class StageResult:
    """Base of every stage result: ``to_record`` / ``from_record`` round-trip through JSON."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    LEGACY: ClassVar[tuple[str, ...]] = ()   # read from old records, never written

    def to_record(self) -> dict:
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if not (k in self.LEGACY and v is None)}
        return {"kind": str(self.KIND), "record_version": self.VERSION, **fields}

    @classmethod
    def from_record(cls, record: dict, where: str = "") -> "StageResult":
        kind = record.get("kind", cls.KIND)   # untyped records predate kinds: version 1
        version = int(record.get("record_version", 1))
        at = f" ({where})" if where else ""
        if kind != cls.KIND:
            raise StageRecordError(f"stage record{at} is a {str(kind)!r} result, expected "
                                   f"{str(cls.KIND)!r}; the run's manifest was edited or mixed "
                                   "up")
        if version > cls.VERSION:
            raise StageRecordError(f"stage record{at} is {cls.KIND} version {version}, newer "
                                   f"than this code reads ({cls.VERSION}); upgrade Spotlight to "
                                   "resume this run")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


@dataclass(frozen=True)
class PlanResult(StageResult):
    """The planner's exploration of one iteration: (N candidates, M steps) and when."""

    KIND: ClassVar[str] = Stage.PLAN
    plan: dict = field(default_factory=dict)
    planned_at: float = 0.0

    @classmethod
    def of(cls, plan: Plan, planned_at: float) -> "PlanResult":
        return cls(dataclasses.asdict(plan), planned_at)

    @property
    def as_plan(self) -> Plan:
        return Plan(**self.plan)


@dataclass(frozen=True)
class ExploreResult(StageResult):
    """Candidates scored for an iteration (stale on spot: ``explore``; fresh: ``explore-sync``);
    the candidates themselves are in ``candidates.json`` of the stage."""

    KIND: ClassVar[str] = Stage.EXPLORE
    explored: int = 0
    planned: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    preemptions: int = 0


@dataclass(frozen=True)
class SelectionResult(StageResult):
    """Where the seeds of an iteration came from; the seeds are in ``selection.json``."""

    KIND: ClassVar[str] = Stage.SELECTION
    LEGACY: ClassVar[tuple[str, ...]] = ("selection",)
    source: str = "random"           # explore, explore-sync, fallback-random, random
    selection: dict | None = None    # runs recorded before the seeds left the manifest


@dataclass(frozen=True)
class AuditResult(StageResult):
    """Stale against fresh ranking of random candidates (details in ``audit.json``)."""

    KIND: ClassVar[str] = Stage.AUDIT
    kendall_tau: float | None = None


@dataclass(frozen=True)
class RolloutResult(StageResult):
    """The rollout's log-probabilities and seeds are in ``rollout.npz``, its latents streamed."""

    KIND: ClassVar[str] = Stage.ROLLOUT
    task: dict | None = None
    dispatch: dict | None = None   # a pulled rollout's dispatch summary (placement.rollout)
    sp: dict | None = None         # an SP rollout's summary: groups, losses, resumed requests


@dataclass(frozen=True)
class RewardResult(StageResult):
    """The rollout's rewards are in ``reward.npz``."""

    KIND: ClassVar[str] = Stage.REWARD
    mean: float = 0.0
    task: dict | None = None


@dataclass(frozen=True)
class TrainResult(StageResult):
    """θ_k -> θ_k+1: the optimiser's statistics; the weights are checkpoint k+1."""

    KIND: ClassVar[str] = Stage.TRAIN
    stats: dict = field(default_factory=dict)
    task: dict | None = None


@dataclass(frozen=True)
class ValidationResult(StageResult):
    """Mean held-out reward of weights ``version``."""

    KIND: ClassVar[str] = Stage.VALIDATION
    mean_reward: float = 0.0
    version: int = 0
    task: dict | None = None


@dataclass(frozen=True)
class IterationRecord(StageResult):
    """The finished iteration: its result row and the cost ledger after it (the planner and
    monitor state is in ``planning.json``, the task timeline in ``tasks.json``)."""

    KIND: ClassVar[str] = Stage.ITERATION
    LEGACY: ClassVar[tuple[str, ...]] = ("planner", "monitor")
    result: dict = field(default_factory=dict)
    ledger: dict = field(default_factory=dict)
    planner: dict | None = None      # runs recorded before planning left the manifest
    monitor: dict | None = None


RESULT_TYPES: dict[Stage, type[StageResult]] = {
    Stage.PLAN: PlanResult, Stage.EXPLORE: ExploreResult, Stage.EXPLORE_SYNC: ExploreResult,
    Stage.SELECTION: SelectionResult, Stage.AUDIT: AuditResult, Stage.ROLLOUT: RolloutResult,
    Stage.REWARD: RewardResult, Stage.TRAIN: TrainResult, Stage.VALIDATION: ValidationResult,
    Stage.BASE_VALIDATION: ValidationResult, Stage.ITERATION: IterationRecord,
}


def result_type(stage: str) -> type[StageResult]:
    """The result class of a stage name (``train``, ``explore-sync``, ...)."""
    try:
        return RESULT_TYPES[stage]
    except KeyError:
        raise StageRecordError(f"no stage named {stage!r}; stages are "
                               f"{[str(s) for s in Stage]}") from None


def read_result(stage: str, info: dict, where: str = "") -> StageResult:
    """The typed result of a stage record's ``info``."""
    return result_type(stage).from_record(info, where)

