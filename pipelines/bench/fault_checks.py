"""What ``spotlight bench faults`` measures in a run store after a fault: requests lost, whether
the run equals the clean one, and writes of a fenced attempt or driver found in the run's state.

Pure reads of two run stores (the clean run and the faulted one), so that a scenario and the
tests that check the scenarios share one definition of each figure.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from storage import RunStore
from storage.attempts import Attempt, array_name, lineage_of

STREAMED_STAGES = ("explore", "audit", "rollout")


def requests_lost(clean: RunStore, faulted: RunStore, iterations: int) -> int:
    """Requests the clean run committed in full that the faulted run did not."""
    lost = 0
    for k in range(iterations):
        for kind in STREAMED_STAGES:
            stage = f"iter-{k}/{kind}"
            for request in clean.requests(stage):
                want = clean.latents.committed_step(stage, request)
                if faulted.latents.committed_step(stage, request) < want:
                    lost += 1
    return lost


def identical_runs(clean: RunStore, faulted: RunStore, iterations: int) -> bool:
    """The same final weights and the same rewards and seeds, bit for bit."""
    return not run_differences(clean, faulted, iterations)


def run_differences(clean: RunStore, faulted: RunStore, iterations: int) -> dict:
    """Where the faulted run parts from the clean one ({} where it does not): the iterations
    whose weights differ (or are missing), and per iteration the reward cells that differ, by
    the stage that scored them -- so a mismatch names the first stage it came from."""
    out: dict = {}
    latest = faulted.latest_checkpoint() or 0
    weights = [k for k in range(1, iterations + 1)
               if k > latest or not _same_weights(clean, faulted, k)]
    if weights:
        out["weights"] = weights
    ra, rb = clean.open_rewards(), faulted.open_rewards()
    its_a = [int(i) for i in ra["iteration"].values] if ra is not None else []
    its_b = [int(i) for i in rb["iteration"].values] if rb is not None else []
    if its_a != its_b:
        out["reward_iterations"] = {"clean": its_a, "faulted": its_b}
    rewards = {}
    for k in sorted(set(its_a) & set(its_b)):
        a, b = ra.sel(iteration=k), rb.sel(iteration=k)
        if a["reward"].shape != b["reward"].shape:
            rewards[k] = {"shape": [list(a["reward"].shape), list(b["reward"].shape)]}
            continue
        differ = ~(_same_cells(a["reward"].values, b["reward"].values)
                   & (a["seed"].values == b["seed"].values))
        if differ.any():
            stages = np.asarray(a["stage"].values, dtype=str)[differ]
            rewards[k] = {str(st): int((stages == st).sum()) for st in np.unique(stages)}
    if rewards:
        out["rewards"] = rewards
    return out


def _same_weights(clean: RunStore, faulted: RunStore, iteration: int) -> bool:
    wa, wb = clean.load_checkpoint(iteration), faulted.load_checkpoint(iteration)
    return wa.weights.keys() == wb.weights.keys() and all(
        np.array_equal(t.numpy(), wb.weights[n].numpy()) for n, t in wa.weights.items())


def _same_cells(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def lease_taken_at(store: RunStore, epoch: int) -> float | None:
    """When the driver of ``epoch`` took the run's lease (its recorded ``lease`` event)."""
    return next((float(e["at"]) for e in store.read_events()
                 if e.get("kind") == "lease" and e.get("epoch") == epoch), None)


@dataclass(frozen=True)
class GivenUp:
    """An attempt the driver gave up on (its worker cut off): after ``step`` its request
    belongs to another attempt."""

    stage: str
    request: str
    array: str    # the array that attempt wrote
    step: int


def given_up_attempts(dispatch: list[dict], epoch: int) -> list[GivenUp]:
    """The attempts the pull dispatch records show given up: a request requeued off its
    worker (cut off or lost) while that worker ran it. ``dispatch``: per pulled stage
    ``{"stage": "iter-1/explore", "log": [moves]}`` (:func:`pipelines.bench.preemption.
    dispatch_logs`)."""
    out = []
    for entry in dispatch:
        running: dict[str, tuple[int, str]] = {}   # request -> its newest attempt, worker
        for move in entry.get("log", []):
            request = move.get("request", "")
            if move.get("kind") == "assigned":
                running[request] = (int(move.get("attempt", 0)), move.get("worker", ""))
            elif move.get("kind") == "requeued" and request in running:
                number, worker = running[request]
                if worker == move.get("worker"):
                    array = array_name(Attempt(epoch, number), starts_request=number == 1)
                    out.append(GivenUp(entry["stage"], request, array, int(move.get("step", 0))))
    return out


def foreign_lineage_steps(store: RunStore, given_up: list[GivenUp]) -> int:
    """Lineage entries of the stored trajectories that hand a step after the takeover to an
    attempt that was given up by then: a stale attempt's write taken into a trajectory."""
    found = 0
    for g in given_up:
        record = store.latents.commit_record(g.stage, g.request)
        if record is not None:
            found += sum(1 for first, array in lineage_of(record)
                         if array == g.array and first > g.step + 1)
    return found


def stage_records_after(store: RunStore, epoch: int, since: float) -> list[str]:
    """Stage records that a driver of an older ``epoch`` than ``epoch`` wrote after ``since``
    (a takeover): writes of a fenced driver that landed."""
    return [name for name, record in store.manifest.stages().items()
            if record.get("epoch") is not None and record["epoch"] < epoch
            and record.get("at", 0.0) > since]


@dataclass
class Timeline:
    """Lines a process printed, with when this process read them (one clock for every host
    of a test bed: they share the kernel)."""

    lines: list[tuple[float, str]] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, text: str, after: float = 0.0) -> float | None:
        """When the first line containing ``text`` (read after ``after``) came."""
        return next((at for at, line in self.lines if text in line and at >= after), None)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)
