"""What each member of a test SP group runs (spawned processes, gloo on loopback)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

HEADS, HEIGHT, WIDTH, TEXT = 4, 4, 6, 5   # 24 image tokens, 5 text tokens


def tiny_transformer():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=HEADS, joint_attention_dim=32, axes_dims_rope=(4, 6, 6)).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, TEXT, dtype=torch.long)
    mask[1, -2:] = 0   # a padded prompt
    return {"hidden_states": torch.randn(2, HEIGHT * WIDTH, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "encoder_hidden_states_mask": mask,
            "timestep": torch.tensor([0.3, 0.7]),
            "img_shapes": [[(1, HEIGHT, WIDTH)]] * 2}


def member(rank: int, world: int, port: int, out_dir: str, backward: bool) -> None:
    from spotlight.parallel import ulysses

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, x = tiny_transformer(), inputs()
    weight = torch.randn(2, HEIGHT * WIDTH, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(**x, return_dict=False)[0]
    if backward:
        model.zero_grad()
        (model(**x, return_dict=False)[0] * weight).sum().backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters()
                    if p.grad is not None}
        model.zero_grad()
    ulysses.enable(model, dist.group.WORLD)
    result = {"diff": (ulysses.forward(model, dist.group.WORLD, **x) - reference).abs().max()}
    if backward:
        hidden = x.pop("hidden_states")
        out = ulysses.forward_shard(model, dist.group.WORLD, hidden, **x)
        start, stop = ulysses.shard_bounds(HEIGHT * WIDTH, world, rank)
        (out * weight[:, start:stop]).sum().backward()
        ulysses.sum_gradients(model.parameters(), dist.group.WORLD)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == expected.keys() and len(grads) > 20, sorted(grads)
        result["grad_diff"] = max((grads[n] - expected[n]).abs().max() for n in grads)
    ulysses.disable(model)
    with torch.no_grad():   # the same model object runs alone again
        result["after_disable"] = (model(**x if not backward else {**x, "hidden_states": hidden},
                                         return_dict=False)[0] - reference).abs().max()
    torch.save({k: float(v) for k, v in result.items()}, f"{out_dir}/rank{rank}.pt")
    # Every member finishes its collectives before any tears the group down: rank 0 hosts the
    # store and leaving while a peer still talks to it aborted rank 0 (once in CI, world 4).
    dist.barrier()
    dist.destroy_process_group()


def late_member(rank: int, port: int, out_dir: str) -> None:
    """Join a group of two through the executor (a 2 s join timeout); rank 1 then reaches the
    first collective 4 s late -- busy, not lost."""
    import time
    from datetime import timedelta

    from pipelines.parallel import executor

    executor.JOIN_TIMEOUT = timedelta(seconds=2)
    state = executor.state()
    state.model, state.version = tiny_transformer(), 0
    state.rendezvous = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                                              timeout=executor.JOIN_TIMEOUT)
    executor.join(1, rank, 2, "127.0.0.1", port, 0)
    if rank == 1:
        time.sleep(4)
    total = torch.ones(1)
    dist.all_reduce(total)
    torch.save(float(total.item()), f"{out_dir}/late{rank}.pt")


def fails_alone_or_waits(epoch: int, failing_rank: int, step_timeout_s: float) -> None:
    """A request on a formed group (:mod:`pipelines.parallel.executor`) in which one member
    fails on its own -- a bug, an out-of-memory on its device -- while the others wait for it
    in a collective. The wait is bounded by ``step_timeout_s``, so a peer left hanging shows
    as a timeout error instead of the lost connection."""
    from datetime import timedelta

    from pipelines.parallel import executor

    executor.check_epoch(epoch)
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=step_timeout_s))
    with executor.breaks_on_error():
        if dist.get_rank() == failing_rank:
            raise RuntimeError("this member's own failure")
        dist.broadcast(torch.zeros(1), src=failing_rank)
