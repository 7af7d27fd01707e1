"""Names and records every task shares: a stage's folder name, an exploration request's name,
and the task record (stage, iteration, worker, start, end, weights version, and what the task
adds) that the timeline, the audit and the benches read back from the run store as JSON."""
from __future__ import annotations

import os
import time

from storage.manifest import stage_name  # noqa: F401  (re-exported: the tasks' stage names)


def explore_request(prompt_index: int, chunk: int) -> str:
    return f"p{prompt_index:04d}-c{chunk:04d}"


# An explored request's samples, kept for objective.train_on_explored (pipelines.run.explored).
EXPLORED_SAMPLES = "samples-"
STAGES_WITH_SAMPLES = ("explore", "explore-sync")   # the audit's replays are never trained on


def explored_samples(request: str) -> str:
    return f"{EXPLORED_SAMPLES}{request}"


def worker_name() -> str:
    try:
        from distributed import get_worker  # absent in the in-process harness's own runs

        return str(get_worker().name)
    except (ImportError, ValueError):
        return f"local-{os.getpid()}"


def task_record(stage: str, iteration: int, start: float, version: int, **info) -> dict:
    return {"stage": stage, "iteration": iteration, "worker": worker_name(), "start": start,
            "end": time.time(), "weights_version": version, **info}
