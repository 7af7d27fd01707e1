"""The live state of a run for the Dask dashboard's Spotlight page."""
from __future__ import annotations

from typing import Any


def live_observers(session: Any) -> list[Any]:
    return []
