"""What every Spotlight worker process needs, whether the embedded cluster or ``dask worker``
started it.

A worker plugin registered by the session (so workers that join later get it too):

- **Imports.** Dask puts each worker's local directory first on ``sys.path``, and that
  directory holds Dask's own spill folder named ``storage/``. Under an editable install whose
  packages are found by a meta-path finder, that empty folder is imported as a namespace
  package and shadows the project's ``storage`` (``ImportError: cannot import name
  'RunStore' from 'storage' (unknown location)``): a namespace found anywhere on ``sys.path``
  ends the search before such a finder is asked. The plugin, set up before any task arrives,
  takes a local directory that holds such a folder off ``sys.path`` and drops a shadowing
  namespace module. (A regular install, as on a worker VM, is not affected: a regular package
  anywhere on ``sys.path`` wins over a namespace folder.)
- **Speed.** Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``, which also freezes glibc's mmap
  threshold: every large tensor is then mmap'd and unmapped again, and a denoising step took
  2.3x as long (README). The plugin raises glibc's thresholds back with ``mallopt``, stops the
  worker's statistical profiler (a stack sample every 10 ms that takes the GIL from the task)
  and slows the event loop's 20 ms ticks; torch runs ``cluster.threads_per_worker`` threads.
- **The worker's runtime.** What the worker keeps between tasks (a run's models, SP and
  training groups) lives in the plugin's :class:`~pipelines.cluster.runtime.WorkerRuntime`,
  made at set-up and dropped at teardown.
- **Spot priority.** On a shared machine (the embedded cluster) spot workers run niced, as a
  separate spot VM would take only its own cycles.
- **A device each.** On a node with several GPUs every worker process claims one of its own
  (:mod:`pipelines.cluster.devices`), so that ``cuda`` is a different device in each.
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import sys
import threading

from pipelines.cluster.dask_log import LOG_ENV, route_to_file
from pipelines.cluster.devices import node_device_count, pin_worker_device
from pipelines.cluster.runtime import PLUGIN_NAME, WorkerRuntime

log = logging.getLogger(__name__)

PROJECT_PACKAGES = ("storage", "spotlight", "pipelines")
# glibc mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TICK_MS = 1000


def unshadow_project_packages(local_directory: str | None) -> list[str]:
    """Make ``import storage`` (and the other project packages) find the project, not a folder
    of the same name in the worker's local directory; returns the packages it repaired."""
    if local_directory and any(
            os.path.isdir(os.path.join(local_directory, name)) and
            not os.path.isfile(os.path.join(local_directory, name, "__init__.py"))
            for name in PROJECT_PACKAGES):
        here = os.path.abspath(local_directory)
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.invalidate_caches()
    repaired = []
    for name in PROJECT_PACKAGES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None) is None:
            del sys.modules[name]   # a namespace package made of a stray folder
            importlib.import_module(name)
            repaired.append(name)
    return repaired


def restore_malloc_thresholds() -> bool:
    """Undo the effect of the nanny's ``MALLOC_TRIM_THRESHOLD_`` (glibc only); True if applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_MAX))
    except (OSError, AttributeError):
        return False


def quiet_event_loop(worker) -> None:
    """Stop the statistical profiler and slow the periodic ticks of one worker."""
    for name in ("profile", "profile-cycle"):
        callback = worker.periodic_callbacks.pop(name, None)
        if callback is not None:
            callback.stop()
    for name in ("tick", "monitor"):
        callback = worker.periodic_callbacks.get(name)
        if callback is not None and callback.callback_time < TICK_MS:
            callback.callback_time = TICK_MS


def dask_setup(worker) -> None:
    """Preload of the embedded cluster's workers, before the worker says anything:

    - a terminal's Ctrl-C reaches the whole process group, but only the driver may act on it
      -- it stops the run, commits what is done and then closes these workers itself
      (otherwise each would die printing a traceback);
    - Dask's own messages of this process go to the run's log file that the driver names in
      the environment, not to the driver's console (:mod:`pipelines.cluster.dask_log`).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get(LOG_ENV):
        route_to_file(os.environ[LOG_ENV], f"worker {getattr(worker, 'name', '?')}")


def spotlight_worker_setup(threads: int, spot_nice: int = 0, http: bool = True,
                           devices_per_node: int = 0):
    """The worker plugin (see the module docstring); ``http=False`` closes the worker's HTTP
    endpoint (an embedded cluster without a dashboard listens on nothing but Dask's RPC);
    ``devices_per_node``: ``cluster.devices_per_node`` (0: the CUDA devices a worker sees)."""
    from distributed import WorkerPlugin

    class SpotlightWorkerSetup(WorkerPlugin):
        name = PLUGIN_NAME

        def __init__(self, threads: int, spot_nice: int, http: bool,
                     devices_per_node: int) -> None:
            self.threads, self.spot_nice, self.http = threads, spot_nice, http
            self.devices_per_node = devices_per_node
            self.runtime: WorkerRuntime | None = None   # made on the worker, never pickled

        def setup(self, worker) -> None:
            import torch

            self.runtime = WorkerRuntime()   # what the worker keeps between tasks

            repaired = unshadow_project_packages(getattr(worker, "local_directory", None))
            if repaired:
                log.warning("spotlight: %s was shadowed by a folder in the worker's local "
                            "directory; imported the project's package instead", repaired)
            torch.set_num_threads(self.threads)
            restore_malloc_thresholds()
            quiet_event_loop(worker)
            if self.spot_nice and worker.state.total_resources.get("spot", 0) > 0:
                os.nice(self.spot_nice)
            if not self.http and getattr(worker, "http_server", None) is not None:
                worker.http_server.stop()
            count = node_device_count(self.devices_per_node)
            if count > 1 and pin_worker_device(count) is None:
                log.warning("spotlight: worker %s found each of this node's %d devices held by "
                            "another worker process; it computes beside one of them. Start "
                            "at most %d workers per node (dask worker --nworkers %d)",
                            getattr(worker, "name", "?"), count, count, count)

        def teardown(self, worker) -> None:
            if self.runtime is not None:
                self.runtime.clear()   # the run's models go with the worker

    return SpotlightWorkerSetup(threads, spot_nice, http, devices_per_node)


def add_missing_plugins(client, address: str) -> list[str] | str:
    """Give the worker at ``address`` every worker plugin the scheduler holds that it lacks;
    the names added (or why none could be: it may be gone again). The scheduler sends a plugin
    registered later to the workers it reaches then, and a worker cut off by a partition that
    rejoins without registering anew (its connection survived) never gets it."""
    try:
        plugins = client.run_on_scheduler(_scheduler_plugins)
        return client.run(_add_plugins, plugins, workers=[address])[address]
    except Exception as exc:  # noqa: BLE001 - the caller goes on; the answer says why
        return f"not added: {type(exc).__name__}: {exc}"


def _scheduler_plugins(dask_scheduler) -> dict:
    return dict(dask_scheduler.worker_plugins)


async def _add_plugins(plugins: dict, dask_worker) -> list[str]:
    added = []
    for name, plugin in plugins.items():
        if name not in dask_worker.plugins:
            await dask_worker.plugin_add(plugin=plugin, name=name)
            added.append(name)
    return added
