"""The SP and data-parallel tests start their Dask workers as the embedded cluster does: forked
from one server process that imported the project (``cluster.start_method: forkserver``), not
Dask's default of a fresh interpreter each. Set here for the whole session, so a test's speed
does not depend on whether an embedded run earlier in the same pytest process set it (spawned,
the SP chaos test took 70 s instead of 18, the group server 46 s instead of 8)."""
from __future__ import annotations

import pytest

from pipelines.cluster.nanny import use_start_method


@pytest.fixture(scope="session", autouse=True)
def workers_fork_from_a_preloaded_server() -> None:
    use_start_method("forkserver")
