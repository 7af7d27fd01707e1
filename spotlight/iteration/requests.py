"""The typed requests the iteration program makes of its executor, and what each one answers.

The program (:mod:`spotlight.iteration.program`) decides; an executor carries a request out and
sends its answer back. Each request says in its docstring what the executor does, what it
records and what it answers. Requests that start work (:class:`StartExploration`,
:class:`StartAudit`) answer at once with an opaque handle of the executor's; the program gives
it back in the matching ``Finish`` request. Between the two the executor may run the work
concurrently with everything else (the Dask executor does: stale exploration runs on spot
workers while the gpu workers roll out and train).

Recording is the executor's job and always follows the data: a stage is in the stage log only
after what it wrote is in the run store, so a resumed run either finds a stage whole or redoes
it. The program reads the log (:class:`StageView`) to know what is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from spotlight.exploration import Selection
from spotlight.exploration.core import Audit, PerPrompt, Scored
from spotlight.exploration.fidelity import FidelityDecision
from spotlight.exploration.planner import Plan
from spotlight.models.prompts import Prompt


class StageView(Protocol):
    """What the program reads of the stage log: which stages are done, and their records
    (``pipelines.run.stage_log.StageLog`` is one)."""

    def done(self, iteration: int | None, stage: str) -> bool: ...
    def get(self, iteration: int | None, stage: str) -> Any: ...


@dataclass(frozen=True)
class Candidates:
    """The candidates an exploration stage scored for one iteration: per prompt the seeds and
    their rewards, and the task record of every request that finished."""

    per_prompt: PerPrompt
    tasks: list[dict] = field(default_factory=list)

    @property
    def explored(self) -> int:
        return sum(len(seeds) for seeds, _ in self.per_prompt)


# --- reading what is recorded ------------------------------------------------------------------
@dataclass(frozen=True)
class ReadSelection:
    """Answer the :class:`~spotlight.exploration.Selection` recorded for ``iteration``."""

    iteration: int


@dataclass(frozen=True)
class ReadCandidates:
    """Answer the :class:`Candidates` of ``iteration``'s recorded exploration ``stage``
    (``explore`` or ``explore-sync``)."""

    iteration: int
    stage: str


@dataclass(frozen=True)
class ReadRewards:
    """Answer iteration ``iteration``'s rewards (P, G) as its reward stage stored them."""

    iteration: int


# --- decisions to record -----------------------------------------------------------------------
@dataclass(frozen=True)
class RecordPlan:
    """Record the plan that explores ``plan.iteration`` (the ``plan`` stage, at ``at``);
    ``announce``: tell the operator (the planner chose it). Answers None."""

    plan: Plan
    at: float
    announce: bool


@dataclass(frozen=True)
class RecordSelection:
    """Store ``selection`` as ``iteration``'s seeds and record the ``selection`` stage with its
    ``source``. Answers None."""

    iteration: int
    selection: Selection
    source: str


@dataclass(frozen=True)
class RecordAudit:
    """Store the audit of ``iteration`` (the scored requests and the stale/fresh comparison)
    and record the ``audit`` stage. Answers None."""

    iteration: int
    audit: Audit
    scored: list[Any]  # the executor's outputs of the audit requests, in request order


# --- work --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageStarted:
    """Tell the operator a stage of ``iteration`` starts (progress). Answers None."""

    iteration: int
    stage: str


@dataclass(frozen=True)
class FidelityChanged:
    """Tell the operator the fidelity monitor changed its mind. Answers None."""

    decision: FidelityDecision


@dataclass(frozen=True)
class EmbedPrompts:
    """Write the prompt embeddings of ``texts`` to the run store for ``iteration``'s workers
    (policies that keep them there). Answers None."""

    iteration: int
    texts: list[str]


@dataclass(frozen=True)
class StartExploration:
    """Start scoring ``candidates`` seeds of each of ``prompts`` (``iteration``'s first ones)
    with weights ``version`` at ``steps`` denoising steps: stale (``stage`` ``explore``, on the
    spot workers) or synchronous (``explore-sync``, gpu workers). Answers a handle."""

    iteration: int
    version: int
    stage: str
    prompts: list[Prompt]
    candidates: int
    steps: int | None


@dataclass(frozen=True)
class FinishExploration:
    """Wait for the requests of ``work`` (all of them with ``wait_all``, else only as long as
    the executor's deadline allows), store what finished as ``iteration``'s candidates and
    record the ``stage`` with ``planned`` candidates. Answers the :class:`Candidates`."""

    iteration: int
    stage: str
    work: Any
    planned: int
    wait_all: bool


@dataclass(frozen=True)
class StartAudit:
    """Start re-scoring ``picks`` -- (prompt index, prompt, seeds) of ``iteration`` -- with
    weights ``iteration`` at ``steps``. Answers a handle."""

    iteration: int
    picks: list[tuple[int, Prompt, np.ndarray]]
    steps: int | None


@dataclass(frozen=True)
class FinishAudit:
    """Wait for the audit ``work``; answer its scored requests as a list of
    :class:`~spotlight.exploration.core.Scored` and of the executor's outputs, or None when no
    worker ran it."""

    iteration: int
    work: Any


@dataclass(frozen=True)
class RollOutExplored:
    """Gather ``selection``'s explored samples (explored in ``stage``) of the prompts ``rows``
    into ``iteration``'s rollout and record the rollout. Every prompt explored: their
    exploration rewards are written as its rewards. Some: the rollout of the others (a
    :class:`RollOut` of the other rows, before) is joined in, in prompt order, and the whole is
    scored. Answer whether every selected seed of ``rows`` had a kept sample (False: nothing
    written; roll the iteration out)."""

    iteration: int
    prompts: list[Prompt]
    selection: Selection
    stage: str
    rows: tuple[int, ...]


@dataclass(frozen=True)
class RollOut:
    """Roll out ``prompts`` x ``seeds`` with weights ``iteration`` and record the rollout.
    ``rows``: only those prompts (the ones exploration did not cover), stored for a
    :class:`RollOutExplored` to join and not recorded. Answers None."""

    iteration: int
    prompts: list[Prompt]
    seeds: np.ndarray
    rows: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Score:
    """Score ``iteration``'s rollout (or, with ``explored``, take the rewards its explored
    samples were stored with), store the rewards and record the reward stage. Answers the
    rewards (P, G)."""

    iteration: int
    prompts: list[Prompt]
    explored: bool


@dataclass(frozen=True)
class ComputeAdvantages:
    """Answer the group advantages of ``rewards`` (values, kept, group_std)."""

    iteration: int
    rewards: np.ndarray


@dataclass(frozen=True)
class Train:
    """Train weights ``iteration`` into ``iteration + 1`` on the rollout, checkpoint them and
    record the train stage. Answers the optimiser's statistics."""

    iteration: int
    prompts: list[Prompt]
    rewards: np.ndarray
    advantages: dict


@dataclass(frozen=True)
class Validate:
    """Validate weights ``version`` on the held-out prompts and record it. Answers the mean
    validation reward."""

    version: int


StageRequest = (
    ReadSelection
    | ReadCandidates
    | ReadRewards
    | RecordPlan
    | RecordSelection
    | RecordAudit
    | StageStarted
    | FidelityChanged
    | EmbedPrompts
    | StartExploration
    | FinishExploration
    | StartAudit
    | FinishAudit
    | RollOutExplored
    | RollOut
    | Score
    | ComputeAdvantages
    | Train
    | Validate
)
"""Everything the program may ask of an executor."""


def scored_of(out: Any) -> Scored:
    """An exploration output as the core reads it (any object with the fields of
    :class:`~spotlight.exploration.core.Scored`)."""
    return Scored(out.prompt_index, out.chunk, out.seeds, out.rewards)
