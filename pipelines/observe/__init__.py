"""What users watch while a run goes and after: live observers of a Session's events (the
trackers, the dashboard's Spotlight page) and the stored pictures a report reads back.

``build_observers`` is the one place a Session asks for its observers; each is an event
callback (``observer(kind, info)``) with a ``close()``. An observer never stops a run: one that
fails is reported once and dropped (:class:`Observers`)."""
from __future__ import annotations

import logging
from typing import Any, Callable

from pipelines.observe.live import live_observers
from pipelines.observe.tracking import tracking_observers

log = logging.getLogger("spotlight.observe")


class Observers:
    """Fan a Session's events out to its observers; a failing observer is dropped, not fatal."""

    def __init__(self, observers: list[Any], user: Callable[[str, dict], None] | None = None):
        self.observers = list(observers)
        self.user = user

    def __call__(self, kind: str, info: dict) -> None:
        if self.user is not None:
            self.user(kind, info)
        for observer in list(self.observers):
            try:
                observer(kind, info)
            except Exception as err:  # noqa: BLE001 - watching a run must never stop it
                log.warning("observer %s failed on %r and is switched off: %s: %s",
                            type(observer).__name__, kind, type(err).__name__, err)
                self.observers.remove(observer)

    def close(self) -> None:
        for observer in self.observers:
            try:
                observer.close()
            except Exception as err:  # noqa: BLE001
                log.warning("observer %s failed to close: %s", type(observer).__name__, err)
        self.observers = []


def build_observers(session: Any) -> list[Any]:
    """The observers a Session's config asks for (trackers; the dashboard's live page)."""
    return tracking_observers(session) + live_observers(session)
