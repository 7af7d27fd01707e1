"""Data-parallel training over a gloo group: a step's summed gradients equal the
single-process step's on the same batch, and the group is formed anew when a member is lost."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.parallel.dp_worker import member
from tests.ports import LOOPBACK_HTTP, free_port

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("world,objectives", [(2, ("flow-grpo",)), (3, ("flow-grpo", "nft"))])
def test_summed_gradients_equal_the_single_process_step(tmp_path, world, objectives):
    mp.spawn(member, args=(world, free_port(), str(tmp_path), objectives), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}-{objective}.pt", weights_only=True)
               for r in range(world) for objective in objectives]
    assert len(results) == world * len(objectives)
    for r in results:
        assert r["params"] > 10 and r["grad_scale"] > 0
        assert r["grad_diff"] <= 1e-6 * max(1.0, r["grad_scale"]), r["grad_diff"]
        for key, value in r["alone"].items():   # the step's statistics as well
            assert r["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_the_training_group_is_formed_anew_when_a_member_is_lost():
    from distributed import Client, LocalCluster

    from pipelines.parallel.groups import kill_executors, live_workers
    from pipelines.parallel.training import TrainingGroup, group_size

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      **LOOPBACK_HTTP) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        group = TrainingGroup(client)
        members = lambda: sorted(live_workers(client))   # noqa: E731
        assert group.run(members, group_size) == 3
        first = group.epoch
        victim = group.members[-1]
        kill_executors(client, [victim])
        # The first attempt sees the old members (the scheduler has not noticed yet): the
        # survivors' all-reduce meets the dead peer, fails -- each survivor aborting its side,
        # so none waits out the timeout on another -- and the group is formed anew.
        stale = iter([list(group.members)])
        answer = group.run(lambda: next(stale, None) or members(), group_size)
        assert group.epoch > first and victim not in group.members
        assert answer == len(group.members) >= 2
        assert [e["action"] for e in group.log].count("lost") >= 1
