"""Data-parallel training over a group of persistent executors (DDP on gloo, Dask worker
processes): a step's gradients are the single-process step's on the same batch, and after the
steps the group serves SP forwards with the trained weights."""
from __future__ import annotations

import pytest
import torch

from pipelines.bench.sp import SPEC, request_inputs
from pipelines.parallel import executor
from pipelines.parallel.groups import SPGroups, live_workers

pytestmark = pytest.mark.timeout(300)
LR = 0.05


def batch_and_target() -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    one = request_inputs()
    batch = {"hidden_states": torch.randn(4, *one["hidden_states"].shape[1:], generator=g),
             "encoder_hidden_states": torch.randn(4, *one["encoder_hidden_states"].shape[1:],
                                                  generator=g),
             "encoder_hidden_states_mask": torch.ones(4, one["encoder_hidden_states"].shape[1],
                                                      dtype=torch.long),
             "timestep": torch.tensor([0.2, 0.4, 0.6, 0.8]),
             "img_shapes": one["img_shapes"] * 4}
    return batch, torch.randn(4, one["hidden_states"].shape[1], 16, generator=g)


def single_process_step(model, batch: dict, target: torch.Tensor) -> dict:
    model.train().requires_grad_(True).zero_grad(set_to_none=True)
    out = model(**batch, return_dict=False)[0]
    torch.nn.functional.mse_loss(out, target).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= LR * p.grad
    return grads


def test_ddp_steps_over_executors_equal_single_process_steps(tmp_path):
    from distributed import Client, LocalCluster

    from storage import RunStore

    torch.manual_seed(0)
    model = executor.build_model(SPEC)
    url = f"file://{tmp_path}/run"
    RunStore.open(url).save_checkpoint(0, model.state_dict(), None)
    batch, target = batch_and_target()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        sp = SPGroups(client, SPEC, url, 0, (2,))
        sp.add(live_workers(client))
        group = sp.membership.serving()[0]
        for step in (1, 2):
            grads = sp.submit(group, executor.train_step, batch, target, LR, step)[0].result()
            expected = single_process_step(model, batch, target)
            assert grads.keys() == expected.keys() and len(grads) > 20
            assert max(float((grads[n] - expected[n]).abs().max()) for n in grads) <= 1e-5
        model.eval()
        with torch.no_grad():
            reference = model(**request_inputs(), return_dict=False)[0]
        served = sp.forward(group, request_inputs())   # the trained weights, now SP
        assert float((served - reference).abs().max()) <= 1e-5


def test_a_group_that_loses_a_member_trains_on_with_a_new_one(tmp_path):
    """DP on a pair of executors (a third stands by alone), one of the pair SIGKILLed between
    steps: the survivor and the third form a new pair without reloading, and its step is still
    the single-process step on the whole batch."""
    import os
    import signal

    from distributed import Client, LocalCluster

    from storage import RunStore

    torch.manual_seed(0)
    model = executor.build_model(SPEC)
    url = f"file://{tmp_path}/run"
    RunStore.open(url).save_checkpoint(0, model.state_dict(), None)
    batch, target = batch_and_target()
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        sp = SPGroups(client, SPEC, url, 0, (2, 1))
        sp.add(live_workers(client))
        pair = max(sp.membership.serving(), key=lambda g: g.degree)
        spare = next(g for g in sp.membership.serving() if g.degree == 1).members[0]
        sp.submit(pair, executor.train_step, batch, target, LR, 1)[0].result()
        single_process_step(model, batch, target)
        sp.trained(1, pair)   # the spare copies version 1 from a trainer (shared memory)
        assert sp.log[-1]["via"] == "shared-memory"
        survivor, victim = pair.members
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        new = sp.lost(victim)
        assert [sorted(g.members) for g in new] == [sorted([survivor, spare])]
        grads = sp.submit(new[0], executor.train_step, batch, target, LR, 2)[0].result()
        expected = single_process_step(model, batch, target)
        assert max(float((grads[n] - expected[n]).abs().max()) for n in grads) <= 1e-5


def test_a_degree_the_heads_cannot_split_is_refused_before_any_task():
    from spotlight.parallel.ulysses import SequenceParallelError

    with pytest.raises(SequenceParallelError, match="does not divide the model's 4 attention"):
        SPGroups(None, SPEC, "file:///nowhere", 0, (3,))
