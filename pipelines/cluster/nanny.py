"""The embedded cluster's nanny: Dask's own, with more time to close a worker process.

Dask's nanny gives a closing worker process 80% of 5 s to exit, SIGKILLs it, and allows the
remaining second for the exit to be seen by its event loop -- the driver's, shared with the
scheduler and every other nanny. On a loaded 2-core machine that second passes: the close
raises ``TimeoutError`` and leaves the nanny "closing" for good, and ``SpecCluster.close`` then
fails with that error, or waits for the stuck nanny forever (bench preemption hung so after a
spot worker took a preemption notice). These nannies take ``CLOSE_S`` by default.
"""
from __future__ import annotations

from distributed import Nanny

CLOSE_S = 20.0


class EmbeddedNanny(Nanny):
    async def close(self, timeout: float = CLOSE_S, reason: str = "nanny-close") -> str:
        return await super().close(timeout=timeout, reason=reason)

    async def kill(self, timeout: float = CLOSE_S, reason: str = "nanny-kill") -> None:
        await super().kill(timeout=timeout, reason=reason)
