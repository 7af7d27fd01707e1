"""Experiment trackers of a run (``tracking.backends``): TensorBoard by default; Weights &
Biases, MLflow and trackio when installed (the ``[tracking]`` extra).

Each tracker is one observer of the Session. It logs an iteration when the iteration's record
is in the run store (``iteration_done``), and from the store alone -- result row, cost ledger,
task timeline, event batch, validation grids -- so what it logs live is what it logs when it
catches up. Per tracker the store keeps ``tracking/<tracker>.json``: the last iteration logged
and the id that reopens the tracker's run. An iteration is marked before it is logged: a
resumed run logs every iteration that no driver logged, each once, and a crash while logging
can leave one iteration's curves incomplete but never doubled.

Where the files go (``tracking.dir``): ``RUN/tracking/`` for a run on a local file system; for
a run in object storage a local folder of the Spotlight cache, with the TensorBoard event files
copied into the store's ``tracking/tensorboard/`` after every iteration.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipelines.observe.metrics import iteration_metrics, validation_metrics
from pipelines.observe.trackers import Place, Tracker, open_tracker
from pipelines.observe.validation_grid import ValidationGrid, load_grid
from pipelines.run.records import stage_name
from spotlight.cache import cache_dir
from spotlight.config import RunConfig
from spotlight.config.tracking import check_trackers
from spotlight.cost import run_prices
from storage import RunStore
from storage.errors import NotCommittedError
from storage.run import EVENTS

log = logging.getLogger("spotlight.observe")
STAGE = "tracking"   # the store's folder of tracker state and mirrored TensorBoard files


def tracking_observers(session: Any) -> list[Any]:
    """One observer per tracker in ``session.config.tracking.backends``, each caught up with
    the iterations already in the store (a resumed run)."""
    config, store = session.config, session.store
    if not config.tracking.backends:
        return []
    check_trackers(config.tracking)   # a resumed run's config is checked here
    history = RunHistory(store, config)
    place = tracker_place(config, store)
    out = []
    for name in config.tracking.backends:
        try:
            out.append(TrackerObserver(name, place, history))
        except Exception as err:  # noqa: BLE001 - a tracker that cannot start never stops a run
            log.warning("tracker %s could not start and is off for this run: %s: %s", name,
                        type(err).__name__, err)
    return out


def tracker_place(config: RunConfig, store: RunStore) -> Place:
    """Where the run's trackers write (``tracking.dir``, see its documentation)."""
    tracking, location = config.tracking, store.location
    if tracking.dir:
        folder = Path(tracking.dir)
    elif location.scheme == "file":
        folder = Path(location.root) / STAGE
    else:
        folder = cache_dir() / STAGE / location.scheme / location.root.strip("/")
    name = tracking.run_name or store.url.rstrip("/").rsplit("/", 1)[-1]
    return Place(folder=folder, project=tracking.project, run_name=name,
                 offline=tracking.offline, params=flat(config.to_dict()))


def flat(data: dict, prefix: str = "") -> dict:
    """{"grpo": {"lr": 3e-4}} -> {"grpo.lr": 3e-4}."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class RunHistory:
    """What the trackers log, read from the run store (shared by a run's trackers: each
    iteration is read once)."""

    def __init__(self, store: RunStore, config: RunConfig):
        self.store, self.config = store, config
        self.reward = config.reward.name
        self.prices = run_prices(config.cost)
        self._metrics: dict[int, dict[str, float]] = {}
        self._grids: dict[int, ValidationGrid] = {}   # handed over live, by weights version

    def completed(self) -> int:
        k = 0
        while self.store.is_stage_done(stage_name(k, "iteration")):
            k += 1
        return k

    def remember(self, grid: ValidationGrid) -> None:
        """A grid handed over live (the base model's and the next one are still to log)."""
        self._grids = {v: g for v, g in self._grids.items() if v >= grid.version - 1}
        self._grids[grid.version] = grid

    def grid(self, version: int) -> ValidationGrid | None:
        return self._grids.get(version) or load_grid(self.store, version)

    def metrics(self, k: int) -> dict[str, float]:
        """Iteration k's metrics (the store's records of it)."""
        if k not in self._metrics:
            record = self._record(k)
            try:
                tasks = self.store.get_json(stage_name(k, "iteration"), "tasks")["tasks"]
            except NotCommittedError:   # a run recorded before task timelines were kept
                tasks = []
            self._metrics = {k: iteration_metrics(
                record["result"], reward=self.reward,
                groups=self.config.grpo.prompts_per_iteration, beta_kl=self.config.grpo.beta_kl,
                tasks=tasks, events=self.events(k), ledger=record.get("ledger", {}),
                prices=self.prices)}
        return self._metrics[k]

    def _record(self, k: int) -> dict:
        return self.store.stage_record(stage_name(k, "iteration"))["info"]

    def events(self, k: int) -> list[dict]:
        """The run events recorded with iteration k (its batches ``iter-<k>-<driver>``)."""
        prefix, out = f"iter-{k:06d}-", []
        for name in self.store.location.list_names(EVENTS):
            if name.startswith(prefix) and name.endswith(".jsonl"):
                text = self.store.location.read_bytes(EVENTS, name).decode("utf-8")
                out += [json.loads(line) for line in text.splitlines() if line.strip()]
        return out

    def validations(self, k: int) -> list[tuple[int, float, ValidationGrid | None]]:
        """(step, mean reward, grid) of the validations iteration k logs: the base model's
        with iteration 0, and the weights it made (version k+1) if they were validated. The
        grid is None for runs recorded before grids were kept."""
        out = []
        base = self.store.stage_record("base-validation") if k == 0 else None
        if base is not None:
            out.append((0, float(base["info"]["mean_reward"]), self.grid(0)))
        val_reward = self._record(k)["result"].get("val_reward")
        if val_reward is not None:
            out.append((k + 1, float(val_reward), self.grid(k + 1)))
        return out


class TrackerObserver:
    """One tracker following a Session: it logs each iteration once, from the run store."""

    def __init__(self, name: str, place: Place, history: RunHistory):
        self.name, self.history = name, history
        state = self._state()
        self.logged = int(state.get("logged", -1))
        upload = None
        if history.store.location.scheme != "file":
            upload = self._upload
        self.tracker: Tracker = open_tracker(name, place, state.get("run"), upload)
        try:
            if state.get("run") != self.tracker.identity:
                self._save()
            self.catch_up(history.completed())
        except BaseException:
            self.tracker.close()
            raise

    def __call__(self, kind: str, info: dict) -> None:
        if kind == "validation_done":
            self.history.remember(info["grid"])
        elif kind == "iteration_done":
            self.catch_up(int(info["iteration"]) + 1)

    def catch_up(self, done: int) -> None:
        """Log every recorded iteration below ``done`` that no driver has logged."""
        if done <= self.logged + 1:
            return
        for k in range(self.logged + 1, done):
            metrics = self.history.metrics(k)
            self.logged = k
            self._save()   # before logging: never twice, at worst once incomplete
            self.tracker.log_scalars(k, metrics)
            for step, mean_reward, grid in self.history.validations(k):
                scalars = validation_metrics(mean_reward, reward=self.history.reward)
                if grid is None:
                    self.tracker.log_scalars(step, scalars)
                else:
                    self.tracker.log_grid(step, grid, scalars)
        self.tracker.flush()

    def close(self) -> None:
        self.tracker.close()

    # --- the tracker's state in the run store -----------------------------------------------------
    def _state(self) -> dict:
        try:
            return self.history.store.get_json(STAGE, self.name)
        except NotCommittedError:
            return {}

    def _save(self) -> None:
        self.history.store.put_json(STAGE, self.name, {"logged": self.logged,
                                                      "run": self.tracker.identity})

    def _upload(self, name: str, data: bytes) -> None:
        self.history.store.location.write_bytes(data, STAGE, self.name, name, durable=False)
