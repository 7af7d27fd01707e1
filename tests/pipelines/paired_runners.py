"""Stand-ins for ``paired.run_job`` that the bench's worker processes import by name (a spawned
process cannot run a function defined inside a test)."""
from __future__ import annotations

import os
import signal
import time


def pid_job(plan, job) -> dict:
    """Which process ran ``job``."""
    return {"pid": os.getpid(), "wall_s": 0.0}


def killed_job(plan, job) -> dict:
    """Seed 1's job dies as a process the kernel's out-of-memory killer ends; the others take
    a moment, as real jobs take minutes (forked from the preloaded server, an instant job
    finished, and the next started, before the bench heard of the death)."""
    if job.seed == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(2.0)
    return {"pid": os.getpid(), "wall_s": 2.0}
