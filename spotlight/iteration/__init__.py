"""One RL iteration, written once: the program that decides (:mod:`.program`), the typed
requests it makes of an executor (:mod:`.requests`) and where its seconds come from
(:mod:`.timing`). Executors live in ``pipelines.run``: the Dask driver and the in-process run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spotlight.iteration import requests
from spotlight.iteration.program import (
    IterationOutcome,
    IterationProgram,
    Program,
    explore_window,
    explored_rows,
    explored_stage,
    pulled,
    selected_seed_tau,
    validation_due,
)
from spotlight.iteration.timing import NoPlanningTime, PlanningInputs, PlanningTime, TimeModel


def drive(program: Program, handle: Callable[[Any], Any]) -> Any:
    """Run ``program`` to its end: each request it yields goes to ``handle``, whose answer is
    sent back; returns what the program returns. An error of ``handle`` ends the program."""
    answer = None
    while True:
        try:
            request = program.send(answer)
        except StopIteration as finished:
            return finished.value
        try:
            answer = handle(request)
        except BaseException:
            program.close()
            raise


__all__ = [
    "IterationOutcome",
    "IterationProgram",
    "NoPlanningTime",
    "PlanningInputs",
    "PlanningTime",
    "Program",
    "TimeModel",
    "drive",
    "explore_window",
    "explored_stage",
    "pulled",
    "requests",
    "selected_seed_tau",
    "explored_rows",
    "validation_due",
]
