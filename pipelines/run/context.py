"""What a stage sees of the run that holds it.

Stages and backends do not take the driver; they take a :class:`StageContext` -- the run's
config and store, the cluster, the stage log, a way to submit a task and wait for its result --
and the driver is one. State that outlives an iteration (an SP rollout's executor groups, the
data-parallel training communicator) lives in one named place, :class:`CarriedOver`, formed on
first use and kept for the next iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from pipelines.cluster import GPU, ClusterHandle
from pipelines.parallel.groups import SPGroups
from pipelines.parallel.training import TrainingGroup
from pipelines.run.stage_log import StageLog
from spotlight.config import RunConfig
from spotlight.models.prompts import Prompt
from spotlight.scheduling.liveness import CutOffs
from storage import RunStore


@dataclass
class CarriedOver:
    """What a run keeps formed from one iteration to the next."""

    sp_groups: SPGroups | None = None               # the SP rollout's executor groups
    training_group: TrainingGroup | None = None     # the data-parallel training communicator
    # Workers whose requests fell silent (cut off by a partition): no pool gives them work
    # until the scheduler hears from them again (once per run).
    cut_off: CutOffs = field(default_factory=CutOffs)


class RunContext(Protocol):
    """What exploration uses of the run that holds it."""

    config: RunConfig
    store: RunStore
    cluster: ClusterHandle
    mode: str
    log: StageLog
    carried: CarriedOver

    def emit(self, kind: str, /, **info: Any) -> None: ...
    def record_event(self, kind: str, info: dict) -> None: ...
    def submit(self, fn: Callable, *args: Any, resource: str, name: str, **kwargs: Any): ...
    def prompts(self, iteration: int) -> list[Prompt]: ...
    def check_running(self) -> None: ...
    def await_futures(self, futures: list, what: str, resource: str = GPU) -> None: ...


class RequestPools(Protocol):
    """Waiting on and collecting the requests a stage dispatched (pulled or pushed)."""

    def wait_all(self, work: Any, what: str = "exploration",
                 resource: str | None = None) -> None: ...
    def collect(self, work: Any, stage: str) -> tuple[list, int, dict | None]: ...


class StageContext(RunContext, Protocol):
    """What a stage or a rollout backend uses of the run that holds it."""

    exploration: RequestPools   # pipelines.run.exploration.Exploration

    def placed(self, stage: str) -> tuple[str, ...]: ...
    def worker_class(self, stage: str) -> str: ...
    def result(self, future, what: str, resource: str = GPU) -> Any: ...
