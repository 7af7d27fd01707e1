"""A finished SP answer whose worker died before the driver fetched it is not waited for."""
from __future__ import annotations

from types import SimpleNamespace

from pipelines.parallel.serve import GroupServer, Served


class AnswerLostWithItsWorker:
    """Rank 0's future: finished, but its data went with the killed worker, so fetching it
    would wait for a recomputation pinned to that dead worker."""

    status = "finished"

    def done(self) -> bool:
        return True

    def result(self, timeout=None):
        assert timeout is not None, "the answer is fetched without a timeout: it would hang"
        raise TimeoutError


def server_with(groups: dict) -> GroupServer:
    server = GroupServer.__new__(GroupServer)   # only the state _finished reads
    server.running, server.served = {}, Served()
    server.sp = SimpleNamespace(membership=SimpleNamespace(groups=groups))
    return server


def test_the_answer_is_looked_for_again_while_its_group_stands_and_dropped_once_it_broke():
    future = AnswerLostWithItsWorker()
    server = server_with({"g": object()})
    server.running[future] = ("r0", 1, "g", [future, object()])
    server._finished(future)
    assert list(server.running) == [future] and server.served.results == {}
    server.sp.membership.groups.clear()   # the loss is seen: the dispatcher requeued r0
    server._finished(future)
    assert server.running == {} and server.served.results == {}
