"""Stand-ins for ``paired.run_job`` that the bench's worker processes import by name (a spawned
process cannot run a function defined inside a test)."""
from __future__ import annotations

import os
import signal


def pid_job(plan, job) -> dict:
    """Which process ran ``job``."""
    return {"pid": os.getpid(), "wall_s": 0.0}


def killed_job(plan, job) -> dict:
    """The first seed's job dies as the kernel's out-of-memory killer ends a process."""
    if job.seed == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"pid": os.getpid(), "wall_s": 0.0}
