"""A worker's long-lived state, owned by one object.

A Spotlight worker keeps state from task to task: a run's policy, reward model and trainer
(:class:`pipelines.run.tasks.WorkerContext`), the SP executor's model and process group
(:mod:`pipelines.parallel.executor`), the training group's rendezvous and communicator
(:mod:`pipelines.parallel.training`). Each of those modules keeps its part in a named slot of
the worker's :class:`WorkerRuntime` instead of a module global, so that

- one object owns it: the worker plugin (:mod:`pipelines.cluster.worker_setup`) makes it when
  the worker starts and drops it -- the memory with it -- when the worker closes;
- a test or an in-process run starts afresh with one call (:func:`reset_runtime`);
- what must know of every attempt a worker runs (fencing, next) has one place to live.

Outside a Dask worker (the in-process harness, benches, tests) the process has a runtime of
its own.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

from distributed import get_worker

T = TypeVar("T")
PLUGIN_NAME = "spotlight-worker-setup"   # the worker plugin that owns a worker's runtime


class WorkerRuntime:
    """Named slots of state, each made on first use and kept until the runtime is cleared."""

    def __init__(self) -> None:
        self._slots: dict[str, Any] = {}
        self._lock = threading.Lock()

    def slot(self, name: str, make: Callable[[], T]) -> T:
        """The state called ``name``, made by ``make()`` the first time it is asked for."""
        with self._lock:
            if name not in self._slots:
                self._slots[name] = make()
            return self._slots[name]

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()


_PROCESS = WorkerRuntime()   # outside a Dask worker, or on one without the plugin


def runtime(worker=None) -> WorkerRuntime:
    """The runtime of ``worker`` -- by default the worker this task runs on (functions sent with
    ``client.run`` are not tasks: they pass their ``dask_worker``) -- else the process's."""
    if worker is None:
        try:
            worker = get_worker()
        except ValueError:   # not in a worker's task
            return _PROCESS
    held = getattr(worker.plugins.get(PLUGIN_NAME), "runtime", None)
    return held if held is not None else _PROCESS


def reset_runtime() -> None:
    """Drop this process's runtime state (a finished in-process run; tests)."""
    runtime().clear()
