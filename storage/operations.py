"""How many store operations this process has made, by kind: what the control plane costs the
store, read by ``spotlight bench scale`` and beside a run's other figures.

Every access of :class:`storage.urls.RunLocation` goes through its ``retry`` and is counted once
there, however many tries it took: one request on S3 for a small object or a chunk.
"""
from __future__ import annotations

import threading
from collections import Counter

READS = frozenset({"read", "check", "list", "open"})   # the kinds that change nothing
_ALIASES = {"conditional": "write", "append": "write", "consolidate": "write"}
_counts: Counter = Counter()
_lock = threading.Lock()


def kind_of(what: str) -> str:
    """``"write latent step 3 to"`` -> ``"write"``: the operation, without its object."""
    word = what.split(" ", 1)[0]
    return _ALIASES.get(word, word)


def count(what: str) -> None:
    with _lock:
        _counts[kind_of(what)] += 1


def operations() -> dict[str, int]:
    """The operations so far, by kind (a copy: subtract two to get what happened between)."""
    with _lock:
        return dict(_counts)


def reads(counts: dict[str, int]) -> int:
    return sum(n for kind, n in counts.items() if kind in READS)
