"""The events a :class:`~spotlight.scheduling.dispatch.Dispatcher` takes in and the actions it
gives out: plain frozen records, so that the glue (a live cluster's, or the simulator's) and the
tests build and compare them without the dispatcher's state."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


# --- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerJoined:
    worker: str
    slots: int = 1
    cls: str = "spot"   # worker class (gpu = on-demand, spot): for offload decisions


@dataclass(frozen=True)
class NoticeReceived:
    """The worker will be preempted: it takes nothing new and hands back what it runs."""

    worker: str
    source: str = ""


@dataclass(frozen=True)
class WorkerLost:
    worker: str


@dataclass(frozen=True)
class RequestSubmitted:
    request: str


@dataclass(frozen=True)
class RequestsSubmitted:
    """A stage's requests, queued in this order at once: the workers pull once, not once per
    request (the same assignments while nothing is known of their speeds)."""

    requests: tuple[str, ...]


@dataclass(frozen=True)
class RequestProgressed:
    request: str
    step: int   # the newest committed denoising step


@dataclass(frozen=True)
class RequestDone:
    request: str
    attempt: int
    seconds: float | None = None   # how long the attempt ran: the worker's measured speed


@dataclass(frozen=True)
class RequestPreempted:
    """An attempt stopped at a step boundary after a notice, its latents committed."""

    request: str
    attempt: int
    step: int


@dataclass(frozen=True)
class AttemptOvertaken:
    """An attempt found the run store ahead of it: a twin attempt of the request (speculative,
    or one given up on that still runs) committed past the step it started from. It stopped;
    neither a preemption nor a failure."""

    request: str
    attempt: int
    step: int   # the request's committed step in the run store


@dataclass(frozen=True)
class ResultLost:
    """An attempt finished but its result could not be fetched; ``worker_alive`` says whether
    its worker is still in the cluster (if not, the result went with it)."""

    request: str
    attempt: int
    worker: str
    worker_alive: bool
    step: int = 0   # the request's committed step in the run store


@dataclass(frozen=True)
class Tick:
    """Time passes (the glue's clock, in seconds): starvation may have lasted too long.
    ``arriving``: workers that joined the cluster and are still loading weights (not starved
    while they come)."""

    now: float
    arriving: int = 0


@dataclass(frozen=True)
class StageClosed:
    """The deadline (or the caller) ends the stage: nothing more runs."""


Event = (WorkerJoined | NoticeReceived | WorkerLost | RequestSubmitted | RequestsSubmitted
         | RequestProgressed
         | RequestDone | RequestPreempted | AttemptOvertaken | ResultLost | Tick | StageClosed)


# --- actions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assign:
    request: str
    worker: str
    attempt: int
    resume_step: int   # committed steps the attempt can skip (0 = from the initial noise)


@dataclass(frozen=True)
class Cancel:
    request: str
    worker: str
    attempt: int


@dataclass(frozen=True)
class Requeued:
    request: str
    worker: str
    step: int
    hard: bool   # True: the worker vanished; False: handed back after a notice


@dataclass(frozen=True)
class Retired:
    """A noticed worker has nothing in flight any more: it may leave."""

    worker: str


@dataclass(frozen=True)
class Starved:
    """Requests wait and no worker can take them (every spot worker is gone or leaving)."""

    waiting: int


@dataclass(frozen=True)
class GaveUp:
    """Requests waited ``waited_s`` with no worker to take them: the stage closed without them."""

    waited_s: float
    waiting: int


@dataclass(frozen=True)
class Ignored:
    event: object
    reason: str


Action = Assign | Cancel | Requeued | Retired | Starved | GaveUp | Ignored


# --- records: events as plain data (what a live pool keeps, what a replay reads back) ------------
def event_record(event: Event, names: dict[str, str] | None = None) -> dict:
    """``event`` as plain data, its worker address replaced by the worker's name in ``names``."""
    fields = dataclasses.asdict(event)
    if "worker" in fields and names:
        fields["worker"] = names.get(fields["worker"], fields["worker"])
    return {"event": type(event).__name__, **fields}


def event_from_record(record: dict) -> Event:
    """The event an :func:`event_record` describes."""
    fields = {k: v for k, v in record.items() if k != "event"}
    if "requests" in fields:   # JSON turned the tuple into a list
        fields["requests"] = tuple(fields["requests"])
    return globals()[record["event"]](**fields)
