"""The Dask side of pull dispatch (``pipelines/cluster/dispatch.py``) on an in-process Dask cluster:
requests pulled by free slots only, results in, failures surfaced, cancel on close, starvation."""
from __future__ import annotations

import threading
import time

import pytest

from pipelines.cluster import ClusterHandle, TaskFailedError
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from spotlight.config import PreemptionConfig
from tests.ports import LOOPBACK_HTTP

pytestmark = pytest.mark.timeout(120)
RUNNING = {"now": 0, "peak": 0}
_LOCK = threading.Lock()


def square(x: int, hold_s: float = 0.05) -> dict:
    with _LOCK:
        RUNNING["now"] += 1
        RUNNING["peak"] = max(RUNNING["peak"], RUNNING["now"])
    time.sleep(hold_s)
    with _LOCK:
        RUNNING["now"] -= 1
    from distributed import get_worker

    return {"value": x * x, "worker": get_worker().name}


def broken(x: int) -> dict:
    raise ValueError(f"request {x} is broken")


@pytest.fixture
def spot_cluster():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                           resources={"spot": 1}, **LOOPBACK_HTTP)
    client = Client(cluster)
    RUNNING.update(now=0, peak=0)
    yield ClusterHandle(client, cluster)
    client.close()
    cluster.close()


def _specs(fn, n: int, *extra) -> list[RequestSpec]:
    return [RequestSpec(f"r{i:02d}", fn, (i, *extra), "iter-0/explore", f"r{i:02d}")
            for i in range(n)]


def test_every_request_runs_once_on_a_free_slot_and_nobody_is_told_of_starvation(spot_cluster):
    events = []
    pool = RequestPool(spot_cluster, _specs(square, 10), PreemptionConfig(),
                       on_event=lambda kind, info: events.append((kind, info)))
    assert pool.wait(60)
    results = pool.close()
    assert {name: out["value"] for name, out in results.items()} == {f"r{i:02d}": i * i
                                                                     for i in range(10)}
    # two workers with one spot slot each (their 2 threads notwithstanding): never more at once
    assert RUNNING["peak"] <= 2
    assert {str(out["worker"]) for out in results.values()} == set(
        spot_cluster.workers_by_class()["spot"])
    summary = pool.summary()
    assert summary["finished"] == 10 and summary["attempts"] == 10 and not summary["gave_up"]
    assert not [e for e in events if e[1].get("what") == "starved"], events


def test_a_request_that_raises_is_an_error_not_a_preemption(spot_cluster):
    pool = RequestPool(spot_cluster, _specs(broken, 2), PreemptionConfig())
    with pytest.raises(TaskFailedError, match=r"iter-0/explore request r0\d failed on a 'spot' "
                                              r"worker: ValueError: request \d is broken"):
        pool.wait(60)


def test_closing_early_cancels_what_still_waits_and_keeps_what_finished(spot_cluster):
    pool = RequestPool(spot_cluster, _specs(square, 8, 0.5), PreemptionConfig())
    # Close once the first request has finished (a fixed sleep raced a busy machine's pulls):
    # each takes 0.5 s and the two spot workers run one each, so most still wait.
    deadline = time.monotonic() + 60
    while not pool.summary()["finished"] and time.monotonic() < deadline:
        time.sleep(0.02)
    results = pool.close()
    summary = pool.summary()
    assert 0 < len(results) < 8 and summary["cancelled"] >= 8 - len(results) - 2
    assert summary["finished"] == len(results)


def test_no_spot_worker_is_announced_once_and_the_pool_gives_up_after_the_wait():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, processes=False, resources={"gpu": 1},
                           **LOOPBACK_HTTP)
    client = Client(cluster)
    try:
        events = []
        pool = RequestPool(ClusterHandle(client, cluster), _specs(square, 3),
                           PreemptionConfig(no_spot_wait_s=0.5),
                           on_event=lambda kind, info: events.append(info))
        assert pool.wait(30)
        assert pool.close() == {}
        assert [e["what"] for e in events] == ["starved", "gave_up"]
        assert "no spot worker for 0.5 s; 3 requests not run" == pool.gave_up
    finally:
        client.close()
        cluster.close()
