"""Sharded training's mechanics in one process (a group of one): mixed precision as the
anchors train, and a checkpoint round trip. Groups of 2 to 4 are ``bench sharded``'s
(tests/pipelines/test_bench_cli.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from spotlight.parallel.process_groups import as_default, close_group, open_group
from spotlight.parallel.sharded import (
    full_weights,
    load_sharded,
    resting_bytes,
    save_sharded,
    shard_module,
)
from tests.ports import LOOPBACK_HTTP


@pytest.fixture
def group():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=20))
    made = open_group("gloo", store, 0, 1, "test-sharded", timedelta(seconds=20))
    with as_default(made):
        yield made
    close_group(made)


def blocks_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.Linear(8, 2))


def test_a_sharded_step_computes_in_bf16_and_keeps_fp32_shards(group):
    seen = []
    model = blocks_model()
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    shard_module(model, group, [model[0], model[2]], param_dtype=torch.bfloat16)
    model(torch.randn(4, 8)).sum().backward()
    assert seen == [torch.bfloat16]   # the block computed in bf16
    assert {p.dtype for p in model.parameters()} == {torch.float32}   # its shards stay fp32
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}


def test_a_sharded_checkpoint_round_trip_restores_weights_and_moments(group, tmp_path):
    model = blocks_model()
    shard_module(model, group, [model[0], model[2]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    save_sharded(model, optimizer, f"file://{tmp_path}/ckpt")
    held = resting_bytes(model, optimizer)
    # Tensors only (read back with weights_only=True): no value that loading would unpickle.
    stored = FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    assert stored and all(isinstance(m, TensorStorageMetadata) for m in stored.values())

    fresh = blocks_model()
    shard_module(fresh, group, [fresh[0], fresh[2]])
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    load_sharded(fresh, fresh_optimizer, f"file://{tmp_path}/ckpt")
    before, after = full_weights(model), full_weights(fresh)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    moments = [s["exp_avg_sq"].to_local() for s in optimizer.state.values()]
    loaded = [s["exp_avg_sq"].to_local() for s in fresh_optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, loaded)) and moments
    assert resting_bytes(fresh, fresh_optimizer) == held - sum(   # no gradients yet
        p.grad.to_local().numel() * 4 for p in model.parameters())


@pytest.mark.timeout(300)
def test_a_group_that_lost_a_member_re_forms_and_re_shards_from_the_stored_version(tmp_path):
    """Three members write a sharded checkpoint; one is SIGKILLed; the next step, first tried
    on the old members (the scheduler has not noticed yet), fails on the survivors' side at
    once, and runs again on the two left, from the stored shards: the uninterrupted run's
    weights."""
    from distributed import Client, LocalCluster

    from pipelines.bench.sharded import ShardedStep, largest_diff, sharded_step, single_process
    from pipelines.parallel.groups import kill_executors, live_workers
    from pipelines.parallel.training import TrainingGroup

    reference = single_process(2)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      **LOOPBACK_HTTP) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        group = TrainingGroup(client)
        members = sorted(live_workers(client))
        saved = f"file://{tmp_path}/checkpoint"
        group.run(lambda: members, sharded_step, ShardedStep(1, save_to=saved))
        kill_executors(client, [members[-1]])
        stale = iter([members])
        out = group.run(lambda: next(stale, None) or sorted(live_workers(client)),
                        sharded_step, ShardedStep(2, load_from=saved))
    assert len(group.members) == 2 and members[-1] not in group.members
    assert [e["action"] for e in group.log].count("lost") >= 1
    assert largest_diff(out["weights"], reference[1]["weights"]) < 1e-6
