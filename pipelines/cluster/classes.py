"""A worker's class (gpu or spot), read from its resources in one place, and the workers of a
class that went silent while a single task waits on them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spotlight.scheduling.liveness import SilenceReports

GPU, SPOT = "gpu", "spot"


def class_of(resources: dict, classes: tuple[str, ...] = (GPU, SPOT)) -> str | None:
    """A worker's class: the first of ``classes`` its resources declare (None: none of them).
    The one place a worker's class is read from its resources."""
    return next((c for c in classes if resources.get(c, 0) > 0), None)


@dataclass
class Silent:
    """Workers of a waited-on class unheard for ``reports.limit_s``, each told to ``tell``
    (its name, the silence in seconds, what waits) once until it is heard again."""

    reports: SilenceReports
    tell: Callable[[str, float, str], None]

    def look(self, workers: dict, resource: str, what: str) -> None:
        mine = [a for a, i in workers.items() if class_of(i.get("resources", {})) == resource]
        for addr, quiet in self.reports.newly_silent(heard_at(workers), mine).items():
            self.tell(str(workers[addr].get("name", addr)), quiet, what)


def heard_at(workers: dict) -> dict[str, float]:
    """When the scheduler last heard from each worker (its ``last_seen``, the scheduler's
    clock), from its worker entries."""
    return {a: float(i["last_seen"]) for a, i in workers.items() if "last_seen" in i}


def workers_by_class(workers: dict) -> dict[str, list[str]]:
    """Worker names per class, from the scheduler's worker entries (``scheduler_info``)."""
    out: dict[str, list[str]] = {GPU: [], SPOT: []}
    for info in workers.values():
        cls = class_of(info.get("resources", {}))
        if cls is not None:
            out[cls].append(str(info.get("name", info.get("id"))))
    return out


def _worker_classes(dask_scheduler, classes: tuple[str, ...] | None) -> dict[str, str | None]:
    return {address: class_of(ws.resources, classes) if classes else None
            for address, ws in dask_scheduler.workers.items()
            if not classes or class_of(ws.resources, classes)}


def worker_classes(client, classes: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """Address -> class of every live worker of ``classes`` (every worker, class None, without
    ``classes``), asked of the scheduler itself: ``client.scheduler_info()`` may hand back a
    periodically refreshed copy without per-worker entries."""
    return client.run_on_scheduler(_worker_classes, classes=classes)


def scheduler_workers(client) -> dict[str, dict]:
    """Every worker's entry (resources, status, ``last_seen``, ...) as the scheduler holds it
    now, asked of the scheduler itself. ``client.scheduler_info()`` refreshes the client's
    shared copy and then returns it, and the client's own refresh (every 2 s, without the
    per-worker entries) can land in between: a dispatch pool that read such a copy took every
    worker for gone and requeued their requests (seen at 8 workers in ``bench scale``)."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]
