"""The spot worker's side of a preemption notice: hear it, hand requests back, retire (and
the driver's inbox of the notices, :class:`NoticeInbox`).

A :class:`PreemptionWatch` worker plugin listens on the configured notice sources (SIGTERM
here; a file and the cloud metadata endpoints through :mod:`pipelines.cluster.notices`).
On the first notice it sets a process-wide flag that running requests check after every
committed denoising step (:func:`check_notice`): the request stops there, its latents already
committed, and returns a *preempted* result instead of failing -- so nothing counts as a task
failure and no step is lost. It then tells the driver (a ``spotlight-preemption`` event) and
retires the worker gracefully once nothing runs on it.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from dataclasses import dataclass

from pipelines.cluster.notices import build_sources, first_notice
from spotlight.config import PreemptionConfig
from spotlight.scheduling.notice import Notice

NOTICE_TOPIC = "spotlight-preemption"
WARM_UP_KEY = "newcomer-"   # the key prefix of a joining worker's weight loading (no hand-back)
log = logging.getLogger(__name__)

_NOTICED = threading.Event()
_NOTICE: list[Notice] = []


class StopAtStep(Exception):
    """Raised inside a request's step loop after a notice: the steps up to ``step`` are
    committed."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preemption notice: stopping after step {step}")
        self.step = step


@dataclass(frozen=True)
class HandedBack:
    """What a request task returns when a notice stopped it: a result, not a failure. Every
    step through ``step`` is committed in the run store (the next attempt resumes there); the
    task had computed through ``computed_step`` (the difference is what the notice cost)."""

    request: str
    step: int
    computed_step: int
    record: dict


def noticed() -> Notice | None:
    """The notice this process received, if any."""
    return _NOTICE[0] if _NOTICED.is_set() and _NOTICE else None


def check_notice(step: int) -> None:
    """Called after step ``step`` of a request was handed to the committer."""
    if _NOTICED.is_set():
        raise StopAtStep(step)


def _receive(notice: Notice) -> bool:
    """Record the first notice of this process; False if one was already received."""
    if _NOTICED.is_set():
        return False
    _NOTICE.append(notice)
    _NOTICED.set()
    return True


def reset_notice() -> None:
    """Forget a received notice (tests running requests in one process)."""
    _NOTICE.clear()
    _NOTICED.clear()


def _handing_back(worker) -> bool:
    """Whether a task that can hand back (a request) still runs on ``worker``. A weight loading
    has nothing to hand back and cannot stop midway: waiting for it kept noticed workers alive
    by the dozen under a fast trace, each slowing the others' loading, until no newcomer joined."""
    return any(not str(ts.key).startswith(WARM_UP_KEY) for ts in worker.state.executing)


def _polled_sources(cfg: PreemptionConfig) -> list:
    """The notice sources to poll (a file, cloud metadata endpoints); SIGTERM is a handler."""
    return build_sources(list(cfg.notice_sources), file_path=cfg.notice_file,
                         aws_url=cfg.aws_url, gcp_url=cfg.gcp_url, azure_url=cfg.azure_url)


def preemption_watch(config: PreemptionConfig, resource: str = "spot"):
    """A worker plugin that acts on notices in workers holding ``resource``."""
    from distributed import WorkerPlugin

    class PreemptionWatch(WorkerPlugin):
        name = "spotlight-preemption-watch"

        def __init__(self) -> None:
            self.config, self.resource = config, resource

        def setup(self, worker) -> None:
            self._stop = threading.Event()   # made here: the plugin is pickled to each worker
            if worker.state.total_resources.get(self.resource, 0) <= 0:
                return
            self.worker = worker
            cfg = self.config
            if ("sigterm" in cfg.notice_sources
                    and threading.current_thread() is threading.main_thread()):
                signal.signal(signal.SIGTERM, self._on_sigterm)
            sources = _polled_sources(cfg)
            if sources:
                threading.Thread(target=self._poll, args=(sources,), daemon=True,
                                 name="spotlight-notice-poll").start()

        def teardown(self, worker) -> None:
            self._stop.set()

        def _on_sigterm(self, signum, frame) -> None:
            if self.worker.status.name in ("closing", "closed", "closing_gracefully"):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a normal shutdown: die
                signal.raise_signal(signal.SIGTERM)
                return
            self._notify(Notice("sigterm", "SIGTERM received", None))

        def _poll(self, sources) -> None:
            while not self._stop.wait(self.config.notice_poll_s):
                notice = first_notice(sources)
                if notice is not None:
                    self._notify(notice)
                    return

        def _notify(self, notice: Notice) -> None:
            if _receive(notice):
                self.worker.loop.add_callback(self._drain, notice)

        async def _drain(self, notice: Notice) -> None:
            worker = self.worker
            worker.log_event(NOTICE_TOPIC, {
                "worker": worker.address, "name": str(worker.name), "source": notice.source,
                "reason": notice.reason, "deadline_s": notice.deadline_s, "at": time.time()})
            # Info: preemption is routine on spot and the driver reports it (not one line each).
            log.info("spot preemption notice (%s): handing requests back, then retiring",
                     notice.source)
            while _handing_back(worker):   # requests stop at their next step boundary
                await asyncio.sleep(0.05)
            if worker.status.name in ("closing", "closed", "closing_gracefully", "failed"):
                return   # the cluster is shutting it down already; nothing left to retire
            await worker.close_gracefully(reason=f"spot preemption notice ({notice.source})")

    return PreemptionWatch()


class NoticeInbox:
    """Preemption notices the workers logged, collected once per client."""

    _by_client: dict[str, "NoticeInbox"] = {}
    _lock = threading.Lock()

    def __init__(self, client) -> None:
        self.notices: list[dict] = []
        client.subscribe_topic(NOTICE_TOPIC, self._receive)

    def _receive(self, event) -> None:
        msg = event[1] if isinstance(event, tuple) else event
        self.notices.append(dict(msg))

    @classmethod
    def of(cls, client) -> "NoticeInbox":
        with cls._lock:
            inbox = cls._by_client.get(client.id)
            if inbox is None:
                inbox = cls._by_client[client.id] = cls(client)
            return inbox
