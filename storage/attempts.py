"""Attempt fencing: which attempt of a request owns its stored trajectory.

A request can have two live attempts: a straggler and its speculative twin, or a worker cut off
by a partition that still computes after its request was given to another. On a GPU their
latents differ in the last bits (non-deterministic kernels), so a trajectory that takes steps
from both is neither attempt's. Three rules keep a stored trajectory one lineage:

1. **Each attempt writes its own chunks.** The attempt that starts a request writes the array
   ``latent``; an attempt that takes over at step ``s`` writes ``latent-e<E>a<N>`` (its driver's
   lease epoch and the dispatcher's attempt number). No two attempts write one object.
2. **The commit marker is the owner record.** It names the attempt that owns the request and its
   *lineage* -- from which step on which array holds the trajectory -- and every write of it is
   a compare-and-swap (:mod:`storage.conditional`). An attempt takes over with a conditional
   write of a marker naming itself (a *claim*) before it writes a chunk; from then on the older
   attempt's marker writes fail, and it stops.
3. **A newer attempt wins.** An attempt that finds a newer one in the marker never claims.

A stale attempt's late chunks then land in its own array, after its lineage entry ends (or in an
array no lineage names): never in the trajectory a reader or a resume sees.
"""
from __future__ import annotations

from typing import NamedTuple

LATENT = "latent"        # the array of the attempt that started the request


class Attempt(NamedTuple):
    """One attempt of a request, ordered: a newer driver (lease epoch) first, then the
    dispatcher's attempt number within that driver."""

    epoch: int      # the driver's lease epoch (0: a run without a lease)
    number: int     # the dispatcher's attempt number of the request, from 1

    @property
    def key(self) -> str:
        return f"e{self.epoch}a{self.number}"

    def as_json(self) -> list[int]:
        return [self.epoch, self.number]


FIRST = Attempt(0, 1)       # a request run outside a dispatcher (in process, one gpu task)
_UNNAMED = Attempt(-1, 0)   # markers written before attempts were named: older than any


def attempt_of(record: dict | None) -> Attempt:
    """The attempt a commit marker names (markers before fencing name none)."""
    value = None if record is None else record.get("attempt")
    if isinstance(value, list) and len(value) == 2:
        return Attempt(int(value[0]), int(value[1]))
    return _UNNAMED


def lineage_of(record: dict) -> list[tuple[int, str]]:
    """``[(first step, array), ...]`` in step order: array ``a`` holds steps from its first
    step up to the next entry's (markers before fencing: one array, ``latent``)."""
    return [(int(first), str(array)) for first, array in record.get("lineage", [[0, LATENT]])]


def array_name(attempt: Attempt, starts_request: bool) -> str:
    """The array an attempt writes its chunks to."""
    return LATENT if starts_request else f"{LATENT}-{attempt.key}"


def segments(lineage: list[tuple[int, str]], start: int, stop: int) -> list[tuple[str, int, int]]:
    """``(array, first, stop)`` runs covering steps ``start..stop-1``, in order."""
    out = []
    for i, (first, array) in enumerate(lineage):
        end = lineage[i + 1][0] if i + 1 < len(lineage) else stop
        lo, hi = max(first, start), min(end, stop)
        if lo < hi:
            out.append((array, lo, hi))
    return out


def claimed(record: dict | None, attempt: Attempt, first_step: int, base: dict) -> dict:
    """The marker an attempt writes to take over a request it continues at ``first_step``:
    nothing committed yet (``record`` None) -> it starts the request; else it extends the
    lineage with its own array from ``first_step``."""
    if record is None:
        return {**base, "step": -1, "attempt": attempt.as_json(),
                "lineage": [[0, array_name(attempt, True)]]}
    lineage = [list(entry) for entry in lineage_of(record)]
    if attempt_of(record) != attempt:
        # An entry from first_step on holds no committed step (its attempt claimed and
        # stopped before committing one): the new array replaces it.
        lineage = [entry for entry in lineage if entry[0] < first_step]
        lineage.append([first_step, array_name(attempt, False)])
    return {**record, **base, "step": int(record["step"]), "attempt": attempt.as_json(),
            "lineage": lineage}


def fenced_by(stored: dict | None, attempt: Attempt) -> Attempt | None:
    """The newer attempt that owns the request (None: ``attempt`` may go on)."""
    owner = attempt_of(stored)
    return owner if stored is not None and owner > attempt else None
