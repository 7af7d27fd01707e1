"""The stage log: which stages of a run are done, and with what result.

The driver is the manifest's only writer, so the log reads the manifest's stage records once
(when it is opened and again when :meth:`StageLog.refresh` asks for it, once per iteration)
and afterwards knows them: asking "is this stage done?" costs no object-storage read, and
recording a stage is one write. "Skip it if it is recorded, else run it and record it" lives
in :meth:`StageLog.once`, the one place a resumed run decides what to recompute.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from storage import RunStore
from storage.manifest import stage_key, stage_name

from .stages import Stage, StageResult, read_result, result_type

R = TypeVar("R", bound=StageResult)


class StageLog:
    """Typed stage records of one run, read once and written through."""

    def __init__(self, store: RunStore, on_record: Callable[[int | None, str], None] | None = None
                 ) -> None:
        self.store = store
        self.on_record = on_record or (lambda iteration, stage: None)
        self._infos: dict[str, dict] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the manifest's stage records (one read; none for a caching writer)."""
        self._infos = {key: record["info"] for key, record in self.store.manifest.stages().items()}

    def get(self, iteration: int | None, stage: str) -> StageResult | None:
        """The recorded result of a stage, or None if it is not done."""
        name = stage_name(iteration, stage)
        info = self._infos.get(stage_key(name))
        return None if info is None else read_result(stage, info, f"{self.store.url} {name}")

    def done(self, iteration: int | None, stage: Stage | str) -> bool:
        result_type(stage)   # a stage name that does not exist is an error, not "not done"
        return stage_key(stage_name(iteration, stage)) in self._infos

    def record(self, iteration: int | None, stage: str, result: StageResult) -> None:
        """Record a stage done -- only after all of its data is in the run store."""
        expected = result_type(stage)
        if not isinstance(result, expected):
            raise TypeError(f"stage {stage!r} records a {expected.__name__}, got "
                            f"{type(result).__name__}")
        name = stage_name(iteration, stage)
        info = result.to_record()
        self.store.mark_stage_done(name, info)
        self._infos[stage_key(name)] = info
        self.on_record(iteration, stage)

    def once(self, iteration: int | None, stage: str, run: Callable[[], R]) -> tuple[R, bool]:
        """The stage's recorded result, or ``run()``'s, recorded now; and whether it was
        recorded before (a resumed stage)."""
        recorded = self.get(iteration, stage)
        if recorded is not None:
            return recorded, True   # type: ignore[return-value]
        result = run()
        self.record(iteration, stage, result)
        return result, False

    def completed_iterations(self) -> int:
        """How many iterations in a row, from 0, are recorded."""
        k = 0
        while self.done(k, Stage.ITERATION):
            k += 1
        return k
