"""Where the embedded cluster's own Dask messages go: a log file of the run, not the console.

Dask's scheduler, nannies and workers log through the ``distributed`` loggers (and tornado's,
whose event loop they run) to stderr, and the embedded cluster's worker processes inherit the
driver's stderr. On spot capacity a killed worker is normal, yet Dask reports it with
tracebacks ("Worker process died unexpectedly ... TypeError", "Invalid Worker.status
transition") that a user cannot act on and that bury the run's own lines. While an embedded
cluster lives, those loggers of the driver and of every worker process write to one file
instead: ``RUN/logs/dask.log`` for a run on a local file system, else a file in the cache
folder (the console names it). The project's own messages and errors are untouched: they do
not go through these loggers.

The driver's side is :class:`DaskLogRoute`; a worker process's side is :func:`route_to_file`,
called by the preload (``pipelines.cluster.worker_setup.dask_setup``) with the file named in
the worker's environment (:data:`LOG_ENV`).
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from spotlight.cache import cache_dir

LOG_ENV = "SPOTLIGHT_DASK_LOG"
RUN_LOG = ("logs", "dask.log")   # below a run's root
FORMAT = "%(asctime)s {where} pid %(process)d %(name)s %(levelname)s: %(message)s"
# The project asks the scheduler and the workers many times a second (who is alive, a pid);
# Dask logs each such call at INFO ("Run out-of-band function '_worker_classes'"), 8,000 lines in
# one bench sp, which would bury the lines that matter.
CHATTER = ("Run out-of-band function",)


def _not_chatter(record: logging.LogRecord) -> bool:
    return record.levelno > logging.INFO or not str(record.msg).startswith(CHATTER)


@dataclass(frozen=True)
class RunLog:
    """The Dask log file of one run, and the folders that did not exist before it."""

    path: Path
    inside_run: bool
    """True for a run on a local file system (``RUN/logs/dask.log``); else a file in the cache
    folder, which the console names."""
    made: tuple[Path, ...] = ()

    def forget(self) -> None:
        """A run refused before its store was written leaves nothing behind: the file goes,
        and the folders made for it if they hold nothing else."""
        self.path.unlink(missing_ok=True)
        for folder in self.made:   # deepest first
            try:
                folder.rmdir()
            except OSError:
                pass


def run_log_file(store_url: str) -> RunLog:
    """Where the embedded cluster of the run at ``store_url`` logs: inside the run for a
    ``file://`` or bare-path run; otherwise (``s3://``, ``memory://``) a local file in the cache
    folder named after the run and the time."""

    scheme = store_url.split("://", 1)[0] if "://" in store_url else "file"
    if scheme == "file":
        root = store_url.split("://", 1)[1] if "://" in store_url else store_url
        path = Path(os.path.abspath(os.path.expanduser(root))).joinpath(*RUN_LOG)
    else:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", store_url.split("://", 1)[-1].strip("/"))[-80:]
        path = cache_dir() / "logs" / f"{name or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    made = tuple(p for p in path.parents if not p.exists())
    return RunLog(path, scheme == "file", made)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and \
        not isinstance(handler, logging.FileHandler)


# Dask's loggers, and those of tornado, whose event loop Dask runs (an exception in one of
# Dask's callbacks is logged by tornado.application); Dask gives each a console handler.
TREES = ("distributed", "tornado")


def _dask_loggers() -> list[logging.Logger]:
    names = [n for n in list(logging.root.manager.loggerDict)
             if n in TREES or n.startswith(tuple(f"{t}." for t in TREES))]
    return [logging.getLogger(n) for n in sorted(set(names) | {"distributed"})]


class AppendingFile(logging.Handler):
    """Appends each record to a file in one ``write`` (``O_APPEND``), so the lines of the
    driver and of every worker process sharing the file do not interleave. Not a
    ``StreamHandler``: Dask's ``silence_logs`` re-levels each of those on ``distributed``
    while a cluster lives, and this file keeps every record."""

    def __init__(self, path: str | os.PathLike, where: str) -> None:
        super().__init__()
        self.path = os.path.abspath(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.setFormatter(logging.Formatter(FORMAT.format(where=where)))
        self.addFilter(_not_chatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._fd is not None:
                os.write(self._fd, (self.format(record) + "\n").encode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)

    def close(self) -> None:
        with self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        super().close()


def route_to_file(path: str | os.PathLike, where: str,
                  taken: list[tuple[logging.Logger, logging.Handler]] | None = None
                  ) -> list[tuple[logging.Logger, logging.Handler]]:
    """Send this process's Dask records to ``path`` instead of the console. Returns
    the console handlers taken off, by logger: ``taken`` (those an earlier route took) and any
    found now; :func:`restore_console` puts them back."""
    handler = AppendingFile(path, where)
    taken = list(taken or [])
    for logger in _dask_loggers():
        for h in [h for h in logger.handlers if _is_console(h)]:
            logger.removeHandler(h)
            taken.append((logger, h))
    # The root of the tree writes to the file and passes nothing on (to handlers a user put on
    # the root logger, say); so does every logger that Dask gave a console handler and that
    # does not pass its records up (distributed.client, tornado.application).
    root = logging.getLogger("distributed")
    root.propagate = False
    for logger in {root} | {lg for lg, _ in taken if not lg.propagate}:
        logger.addHandler(handler)
    return taken


def detach_file(path: str | os.PathLike) -> None:
    """Take the handlers on ``path`` off every Dask logger and close them."""
    target = os.path.abspath(path)
    for logger in _dask_loggers():
        for h in [h for h in logger.handlers if isinstance(h, AppendingFile) and h.path == target]:
            logger.removeHandler(h)
            h.close()


def restore_console(taken: list[tuple[logging.Logger, logging.Handler]]) -> None:
    for logger, h in taken:
        if h not in logger.handlers:
            logger.addHandler(h)


class DaskLogRoute:
    """The driver's side, from an embedded cluster's start to its close. Logging is one tree
    per process, so the routes of clusters alive at once share it: each adds its file, the
    first takes the console handlers off and the last puts them back."""

    _lock = threading.Lock()
    _active: list["DaskLogRoute"] = []
    _console: list[tuple[logging.Logger, logging.Handler]] = []
    _propagate = False

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def start(self) -> "DaskLogRoute":
        cls = type(self)
        with cls._lock:
            if not cls._active:
                cls._propagate = logging.getLogger("distributed").propagate
            cls._console = route_to_file(self.path, "driver", cls._console)
            cls._active.append(self)
        return self

    def stop(self) -> None:
        cls = type(self)
        with cls._lock:
            if self not in cls._active:
                return
            cls._active.remove(self)
            detach_file(self.path)
            if not cls._active:
                restore_console(cls._console)
                logging.getLogger("distributed").propagate = cls._propagate
                cls._console = []
