"""A run as its store holds it: what a report, a notebook or a Session reads back.

:class:`RunView` reads only what the run store committed and never writes. A run that is still
going is fine to read: an iteration counts once its ``iteration`` stage record is in the
manifest (the driver writes that record last, after the iteration's tasks, rewards and
events), so a view shows the committed iterations and nothing half-written.
"""
from __future__ import annotations

from typing import Any

from pipelines.observe.validation_grid import ValidationGrid, load_grids
from pipelines.run.state import IterationResult
from pipelines.run.tasks import stage_name
from spotlight.config import ConfigError, RunConfig, from_stored
from spotlight.cost import CostLedger, run_prices
from storage import RunStore, StorageConfig
from storage.manifest import stage_key

# Events that mark a spot worker going away (or told to), drawn on the timeline: the
# injector's kills and notices, and the request pool's lost workers and hand-backs.
PREEMPTION_MARKS = {("injector", "kill"): "kill", ("injector", "notice"): "notice",
                    ("request", "worker_lost"): "lost", ("request", "notice"): "notice",
                    ("request", "handed_back"): "hand-back", ("dispatch", "silent"): "silent"}


class RunView:
    """Read-only access to one run's committed iterations, tasks, events, costs and grids."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    @classmethod
    def open(cls, url: str | StorageConfig | RunStore, *,
             endpoint_url: str | None = None) -> "RunView":
        """The run at ``url`` (a path, ``file://``, ``s3://BUCKET/PREFIX``; S3 credentials and,
        without ``endpoint_url``, the endpoint come from the standard AWS variables). A URL
        that holds no run is a :class:`StorageError` that says so; nothing is created."""
        if isinstance(url, RunStore):
            return cls(url)
        config = url if isinstance(url, StorageConfig) else \
            StorageConfig(url=str(url), endpoint_url=endpoint_url)
        return cls(RunStore.open(config, create=False))

    @property
    def url(self) -> str:
        return self.store.url

    # --- the run --------------------------------------------------------------------------------
    def run_info(self) -> dict[str, Any]:
        """What ``record_run`` stored: config, mode, code version, source, public storage."""
        return self.store.manifest.read().get("run", {})

    def config(self) -> dict[str, Any] | None:
        """The run's config as stored (plain data), or None for a store a Session did not start."""
        return self.run_info().get("config")

    def run_config(self) -> RunConfig | None:
        """The stored config as a :class:`RunConfig` (None when there is none)."""
        info = self.run_info()
        if "config" not in info:
            return None
        return from_stored(info["config"], info.get("source", self.url))

    def _stages(self) -> dict[str, dict]:
        return self.store.manifest.stages()   # one read: a consistent look at a running run

    def iteration_records(self) -> list[dict]:
        """The ``info`` of every committed iteration record, from iteration 0 on, in order."""
        stages, out = self._stages(), []
        while (record := stages.get(stage_key(stage_name(len(out), "iteration")))) is not None:
            out.append(record["info"])
        return out

    def completed_iterations(self) -> int:
        return len(self.iteration_records())

    @property
    def results(self) -> list[IterationResult]:
        """One :class:`IterationResult` per committed iteration."""
        return [IterationResult(**info["result"]) for info in self.iteration_records()]

    def stages_in_progress(self) -> list[str]:
        """Stages recorded for the first iteration not yet committed (a running run's
        progress; empty for a finished or stopped run between iterations)."""
        stages, k = self._stages(), self.completed_iterations()
        prefix = stage_key(stage_name(k, "x"))[:-1]
        return [name[len(prefix):] for name in sorted(stages) if name.startswith(prefix)]

    # --- what happened --------------------------------------------------------------------------
    def tasks(self, iterations: int | None = None) -> list[dict]:
        """Every task of the committed iterations (or of the first ``iterations``): stage,
        worker, start, end, weights version."""
        out = []
        for k in range(self.completed_iterations() if iterations is None else iterations):
            out += self.store.get_json(stage_name(k, "iteration"), "tasks")["tasks"]
        return out

    def base_validation(self) -> dict | None:
        record = self.store.stage_record("base-validation")
        return None if record is None else record["info"]

    @property
    def base_val_reward(self) -> float | None:
        info = self.base_validation()
        return None if info is None else float(info["mean_reward"])

    def val_curve(self, results: list[IterationResult] | None = None) -> list[dict]:
        """Validation reward by iteration (0 = the base model), with wall seconds since the
        start."""
        base = self.base_val_reward
        results = self.results if results is None else results
        t0 = results[0].start if results else 0.0
        curve = [] if base is None else [{"iteration": 0, "wall_s": 0.0, "val_reward": base}]
        curve += [{"iteration": r.iteration + 1, "wall_s": r.end - t0, "val_reward": r.val_reward}
                  for r in results if r.val_reward is not None]
        return curve

    def events(self) -> list[dict]:
        """The run's recorded events (preemptions, injections, request moves, leases), by time."""
        return self.store.read_events()

    def preemptions(self, events: list[dict] | None = None) -> list[dict]:
        """Events that mark a worker preempted, told to go or lost: {"worker", "at", "mark",
        "kind", "what"}, by time."""
        events = self.events() if events is None else events
        out = []
        for e in events:
            mark = PREEMPTION_MARKS.get((e.get("kind"), e.get("what")))
            if mark is not None and e.get("worker") and e.get("at") is not None:
                out.append({"worker": str(e["worker"]), "at": float(e["at"]), "mark": mark,
                            "kind": e["kind"], "what": e["what"]})
        return out

    # --- cost and pictures ----------------------------------------------------------------------
    def ledger(self) -> CostLedger | None:
        """The cost ledger after the last committed iteration (None before the first)."""
        records = self.iteration_records()
        return CostLedger.from_dict(records[-1]["ledger"]) if records else None

    def prices(self) -> dict[str, float] | None:
        """USD per GPU-hour by worker class from the run's price table, or None when the table
        is not readable here (a run recorded on another machine)."""
        config = self.run_config()
        if config is None:
            return None
        try:
            return run_prices(config.cost)
        except (ConfigError, OSError):
            return None

    def grids(self) -> list[ValidationGrid]:
        """The stored validation image grids, by weights version (none for older runs)."""
        return load_grids(self.store)
