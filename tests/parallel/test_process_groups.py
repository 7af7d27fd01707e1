"""Two process groups in one process -- an SP group (the default) and a training group -- as a
gpu worker holds them (:mod:`spotlight.parallel.process_groups`)."""
from __future__ import annotations

import multiprocessing
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from spotlight.parallel.process_groups import as_default, close_group, open_group

TIMEOUT = timedelta(seconds=20)


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=TIMEOUT)


def test_closing_the_sp_group_leaves_the_training_group_working():
    sp_store, train_store = _store(), _store()
    sp = open_group("gloo", sp_store, 0, 1, "sp-1", TIMEOUT, default=True)
    train = open_group("gloo", train_store, 0, 1, "train-1", TIMEOUT)
    try:
        assert dist.group.WORLD is sp   # the training group was put aside
        with as_default(train):
            assert dist.group.WORLD is train and dist.get_rank() == 0
        assert dist.group.WORLD is sp
        close_group(sp)   # as an SP executor leaves its group
        assert not dist.is_initialized()
        ones = torch.ones(2)
        dist.all_reduce(ones, group=train)   # still registered and connected
        assert ones.tolist() == [1.0, 1.0]
        assert dist.get_process_group_ranks(train) == [0]
    finally:
        close_group(train)
        close_group(sp)


def _member(rank: int, port: int, extra_groups: int, out) -> None:
    """Make ``extra_groups`` groups of one first (so this process has counted more groups than
    its peer), then join the shared group; put the all-reduced value in ``out``."""
    for n in range(extra_groups):
        close_group(open_group("gloo", _store(), 0, 1, f"mine-{n}", TIMEOUT))
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    group = open_group("gloo", dist.PrefixStore("shared", store), rank, 2, "train-7", TIMEOUT)
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value, group=group)
    out.put((rank, value.item()))
    close_group(group)


@pytest.mark.timeout(120)
def test_members_that_made_different_numbers_of_groups_still_meet():
    """torch names a group by a per-process count, which differs here (0 and 2 groups before):
    named from the name the members share, their keys in the store meet."""
    host = _store()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    members = [context.Process(target=_member, args=(rank, host.port, 2 * rank, out))
               for rank in range(2)]
    for member in members:
        member.start()
    for member in members:
        member.join(timeout=90)
    assert [m.exitcode for m in members] == [0, 0]
    assert sorted(out.get(timeout=5) for _ in members) == [(0, 3.0), (1, 3.0)]
