"""RunStore: one run at one URL -- manifest, stage records, latents, rewards, checkpoints."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from .checkpoints import Checkpoint, CheckpointStore
from .config import StorageConfig
from .driver_lease import DriverLease
from .errors import NotCommittedError
from .latents import LatentStreams, ResumePoint
from .manifest import Manifest, stage_key
from .prompts import PromptEmbeddings
from .rewards import RewardTable
from .sink import LatentSink
from .urls import RunLocation, check_reachable, open_location

log = logging.getLogger(__name__)
EVENTS = "events"   # run events, one JSON-lines object per batch


class RunStore:
    """The run store of one run. Open it with :meth:`RunStore.open`."""

    def __init__(self, config: StorageConfig, location: RunLocation, *,
                 writer: bool = False) -> None:
        self.config = config
        self.location = location
        self.manifest = Manifest(location, cache=writer)
        self.latents = LatentStreams(location)
        self.rewards = RewardTable(location)
        self.checkpoints = CheckpointStore(location, self.manifest)
        self.prompts = PromptEmbeddings(location)
        self.lease: DriverLease | None = None

    def take_lease(self, *, takeover: bool = False, force: bool = False,
                   on_wait: Callable[[str], None] | None = None) -> DriverLease:
        """Acquire the run's lease (``LeaseHeld`` while another driver holds it; ``takeover``
        takes an expired one, waiting out one that is live but not renewed -- a driver that
        just crashed -- and saying so through ``on_wait``; ``force`` takes a live one too) and
        :meth:`hold` it."""
        lease = DriverLease.acquire(self.location, ttl_s=self.config.lease_ttl_s,
                                    takeover=takeover, force=force, on_wait=on_wait)
        self.hold(lease)
        return lease

    def hold(self, lease: DriverLease) -> None:
        """Write as the holder of ``lease`` from now on: the manifest stamps and checks its
        epoch, and every run-state write first checks that the lease is still ours, so after
        another driver's takeover this store refuses to write (DriverFenced)."""
        self.lease = lease
        self.manifest.epoch = lease.epoch
        self.manifest.guard = lease.verify   # a manifest update checks the lease first, too

    @property
    def epoch(self) -> int:
        """The lease epoch this store writes under (0: no lease): the first half of every
        attempt number the driver hands out (:class:`storage.attempts.Attempt`)."""
        return 0 if self.lease is None else self.lease.epoch

    def _guard(self) -> None:
        if self.lease is not None:
            self.lease.verify()

    @classmethod
    def open(cls, target: str | StorageConfig | None = None, *, create: bool = True,
             writer: bool = False, **overrides: Any) -> "RunStore":
        """Open (and with ``create``, initialise) the run at a URL or :class:`StorageConfig`.

        ``overrides`` replace config fields (``RunStore.open("s3://b/run", endpoint_url=...)``).
        The store is probed first (``check_on_open``): an unreachable store fails here, before
        any work, with an error naming the URL and endpoint. Without ``create`` a missing run is
        an error rather than a new run. ``writer``: this process is the run's only manifest
        writer (the driver), so its manifest reads once and then knows it; a pickled store
        (what workers get) is a reader again.
        """
        if target is None:
            config = StorageConfig(**overrides)
        elif isinstance(target, StorageConfig):
            config = StorageConfig(**{**_fields(target), **overrides}) if overrides else target
        elif isinstance(target, str):
            config = StorageConfig(url=target, **overrides)
        else:
            raise TypeError(f"RunStore.open takes a URL or a StorageConfig, got "
                            f"{type(target).__name__}")
        location = open_location(config)
        if config.check_on_open:
            check_reachable(location, create_bucket=config.create_bucket and create, create=create)
        store = cls(config, location, writer=writer)
        if create:
            store.manifest.create()
        elif not store.manifest.exists():
            raise NotCommittedError(f"no Spotlight run at {location.url} (manifest.json not "
                                    "found); check the URL")
        log.info("storage: opened run %s", location.url)
        return store

    def __reduce__(self) -> tuple:
        # Workers reopen from the config (credentials travel in memory only, never to storage).
        return (_reopen, (self.config,))

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    @property
    def url(self) -> str:
        """Canonical URL of the run root."""
        return self.location.url

    @property
    def storage_options(self) -> dict:
        """fsspec options for reading this run with plain xarray/fsspec (holds credentials)."""
        return dict(self.location.storage_options)

    def record_run(self, *, config: Mapping[str, Any] | None = None,
                   code_version: str | None = None, **info: Any) -> dict:
        """Record the run's config and code version in the manifest (credentials refused)."""
        facts = dict(info, storage=self.config.public_dict())
        if config is not None:
            facts["config"] = dict(config)
        if code_version is not None:
            facts["code_version"] = code_version
        return self.manifest.set_run_info(**facts)

    # -- stages -------------------------------------------------------------------------------
    def mark_stage_done(self, stage: str, info: Mapping[str, Any] | None = None) -> dict:
        """Record ``stage`` complete -- only after all its data is committed (flushed)."""
        return self.manifest.mark_stage_done(stage, dict(info or {}))

    def is_stage_done(self, stage: str) -> bool:
        return self.manifest.is_stage_done(stage)

    def stage_record(self, stage: str) -> dict | None:
        return self.manifest.stage_record(stage)

    # -- latents ------------------------------------------------------------------------------
    def latent_sink(self, stage: str | None = None, *, queue_size: int | None = None,
                    commit_interval_s: float | None = None) -> LatentSink:
        """A background committer of denoising-step latents (close or flush it)."""
        interval = self.config.commit_interval_s if commit_interval_s is None else commit_interval_s
        return LatentSink(self.latents, stage, queue_size=queue_size or self.config.queue_size,
                          commit_interval_s=interval)

    def resume_point(self, stage: str, request: str | int) -> ResumePoint | None:
        """(last committed step, latent, weights version) of a request, or None."""
        return self.latents.resume_point(stage, request)

    def read_trajectory(self, stage: str, request: str | int) -> Any:
        return self.latents.read_trajectory(stage, request)

    def requests(self, stage: str) -> list[str]:
        return self.latents.requests(stage)

    # -- small per-stage arrays -----------------------------------------------------------------
    def put_arrays(self, stage: str, name: str, arrays: Mapping[str, Any]) -> None:
        """Write named numpy arrays of a stage as one ``.npz`` object (before its stage record)."""
        import io

        import numpy as np

        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
        self._guard()
        self.location.write_bytes(buffer.getvalue(), stage_key(stage), f"{name}.npz")

    def get_arrays(self, stage: str, name: str) -> dict:
        """The arrays :meth:`put_arrays` wrote; a clear error if the stage never wrote them."""
        import io

        import numpy as np

        try:
            data = self.location.read_bytes(stage_key(stage), f"{name}.npz")
        except FileNotFoundError:
            raise NotCommittedError(f"{self.url}: stage {stage_key(stage)} has no {name}.npz; "
                                    "was the stage completed?") from None
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}

    def array_names(self, stage: str, prefix: str = "") -> list[str]:
        """The names of the stage's :meth:`put_arrays` objects that start with ``prefix``."""
        return [n[:-len(".npz")] for n in self.location.list_names(stage_key(stage))
                if n.endswith(".npz") and n.startswith(prefix)]

    def put_json(self, stage: str, name: str, obj: Any) -> None:
        """Write a JSON document of a stage (task timelines, explored candidates)."""
        import json

        self._guard()
        self.location.write_bytes(json.dumps(obj).encode(), stage_key(stage), f"{name}.json")

    def get_json(self, stage: str, name: str) -> Any:
        import json

        try:
            return json.loads(self.location.read_bytes(stage_key(stage), f"{name}.json"))
        except FileNotFoundError:
            raise NotCommittedError(f"{self.url}: stage {stage_key(stage)} has no {name}.json; "
                                    "was the stage completed?") from None

    # -- rewards ------------------------------------------------------------------------------
    def append_rewards(self, iteration: int, columns: Mapping[str, Any]) -> Any:
        self._guard()
        return self.rewards.append(iteration, columns)

    def open_rewards(self) -> Any:
        return self.rewards.open()

    # -- events -------------------------------------------------------------------------------
    def write_events(self, batch: str, events: list[Mapping[str, Any]]) -> None:
        """Write one batch of run events (worker joins and losses, preemptions, request moves)
        as ``events/<batch>.jsonl``. Object stores cannot append, so each batch is its own
        object; a batch name already there is refused rather than overwritten."""
        import json

        if not events:
            return
        name = f"{batch}.jsonl"
        if self.location.exists(EVENTS, name):
            raise FileExistsError(f"{self.location.child_url(EVENTS, name)} exists; event "
                                  "batches are never overwritten -- pick a new batch name")
        lines = "".join(json.dumps(dict(e), default=str) + "\n" for e in events)
        self._guard()
        self.location.write_bytes(lines.encode(), EVENTS, name)

    def read_events(self) -> list[dict]:
        """Every recorded event of the run, ordered by time (``at``)."""
        import json

        out: list[dict] = []
        for name in self.location.list_names(EVENTS):
            if name.endswith(".jsonl"):
                text = self.location.read_bytes(EVENTS, name).decode("utf-8")
                out += [json.loads(line) for line in text.splitlines() if line.strip()]
        return sorted(out, key=lambda e: e.get("at", 0.0))

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, iteration: int, weights: Mapping[str, Any],
                        optimizer_state: Any = None, **kwargs: Any) -> dict:
        self._guard()
        return self.checkpoints.save(iteration, weights, optimizer_state, **kwargs)

    def write_checkpoint(self, iteration: int, weights: Mapping[str, Any],
                         optimizer_state: Any = None, **kwargs: Any) -> dict:
        """A checkpoint's files, uncommitted; its record goes to :meth:`commit_checkpoint`."""
        self._guard()
        return self.checkpoints.write(iteration, weights, optimizer_state, **kwargs)

    def commit_checkpoint(self, record: dict) -> dict:
        return self.checkpoints.commit(record)

    def load_checkpoint(self, iteration: int | None = None, **kwargs: Any) -> Checkpoint:
        return self.checkpoints.load(iteration, **kwargs)

    def latest_checkpoint(self) -> int | None:
        return self.checkpoints.latest()


def _fields(config: StorageConfig) -> dict:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _reopen(config: StorageConfig) -> RunStore:
    return RunStore.open(config, create=False)
