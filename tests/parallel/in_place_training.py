"""A group of SP executors trains its model in place, data-parallel, for one step: what the
chaos test needs to make a version that only one group holds (the others then copy it). The
product trains on gpu workers and publishes through the run store; this is test scaffolding,
run as a task on each member (:meth:`pipelines.parallel.groups.SPGroups.submit`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipelines.parallel import executor
from spotlight.parallel import ulysses


def train_step(
    epoch: int, batch: dict, target: torch.Tensor, lr: float, version: int
) -> dict | None:
    """One data-parallel step of the group: each member takes its equal share of the batch
    (along the batch axis), DDP averages the gradients over the group, every member applies the
    same SGD step and then holds weights ``version``, back in sequence-parallel serving mode.
    Rank 0 returns the averaged gradients."""
    from torch.nn.parallel import DistributedDataParallel

    st = executor.state()
    executor.check_epoch(epoch)
    model = st.model
    ulysses.disable(model)  # the group is data-parallel: whole sequences, full attention
    model.train().requires_grad_(True)
    try:
        ddp = DistributedDataParallel(model, find_unused_parameters=True)
        rank, world = dist.get_rank(), dist.get_world_size()
        size = target.shape[0] // world
        mine = slice(rank * size, (rank + 1) * size)
        model.zero_grad(set_to_none=True)
        out = ddp(**{k: v[mine] for k, v in batch.items()}, return_dict=False)[0]
        torch.nn.functional.mse_loss(out, target[mine]).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
        del ddp
    finally:  # serving again takes the model as it was (a lost peer: the group re-forms)
        model.zero_grad(set_to_none=True)
        model.eval().requires_grad_(False)
    ulysses.enable(model, dist.group.WORLD)  # sequence-parallel, as the group was formed
    st.version = version
    return grads if rank == 0 else None
