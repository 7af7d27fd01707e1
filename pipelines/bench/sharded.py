"""``spotlight bench sharded``: FSDP2 training over the gpu workers' training group.

An embedded Dask cluster of gpu worker processes forms the training group as data-parallel
training does (:class:`pipelines.parallel.training.TrainingGroup`) and trains a tiny
real-format ``QwenImageTransformer2DModel`` in full (every weight) with a flow-matching loss,
sharded with :mod:`spotlight.parallel.sharded`. For each group size:

1. *Exactness*: the gradients of one sharded step, gathered whole, against the single-process
   step's (fp32; every member computes its share of the batch and the shards are summed).
2. *Memory*: the bytes one member holds at rest after the step (its shards of the weights,
   gradients and AdamW's moments) over what one process holds unsharded -- about ``1/world``.
3. *Resume on another size*: the group writes a sharded checkpoint through fsspec; a group of
   another size loads it and takes the next step; its weights against the uninterrupted
   single-process run's.
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelines.bench.registry import machine, register_bench
from pipelines.cluster import start_embedded
from pipelines.cluster.dask_log import run_log_file
from pipelines.parallel import training
from pipelines.parallel.groups import live_workers
from spotlight.config import ClusterConfig
from spotlight.parallel.process_groups import as_default
from spotlight.parallel.sharded import (
    full_gradients,
    full_weights,
    load_sharded,
    resting_bytes,
    save_sharded,
    shard_module,
)
from spotlight.rl.trainer import share_of

# Two blocks (each sharded alone), 4 heads; 8 x 8 image tokens and 8 text tokens a row.
CONFIG = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
              num_attention_heads=4, joint_attention_dim=32, axes_dims_rope=(8, 12, 12))
SIDE, TEXT, ROWS = 8, 8, 6   # 6 rows: shares of 3, 2 and 1.5 rows -- uneven for 4 members
SEED = 0
LR = 1e-5   # full fine-tuning's usual rate (AdamW moves each weight by about LR a step)


def model_of() -> torch.nn.Module:
    """The transformer every member and the reference start from (the same seed)."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(SEED)
    return QwenImageTransformer2DModel(**CONFIG).train()


def batch(step: int, device: torch.device | str = "cpu") -> tuple[dict, torch.Tensor]:
    """Step ``step``'s inputs and the velocity the loss regresses to, on ``device``."""
    g = torch.Generator().manual_seed(1000 + step)
    inputs = {"hidden_states": torch.randn(ROWS, SIDE * SIDE, 16, generator=g),
              "encoder_hidden_states": torch.randn(ROWS, TEXT, 32, generator=g),
              "encoder_hidden_states_mask": torch.ones(ROWS, TEXT, dtype=torch.long),
              "timestep": torch.rand(ROWS, generator=g),
              "img_shapes": [[(1, SIDE, SIDE)]] * ROWS}
    packed = CONFIG["patch_size"] ** 2 * CONFIG["out_channels"]   # the output of a token
    target = torch.randn(ROWS, SIDE * SIDE, packed, generator=g)
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return moved, target.to(device)


def loss_on(model: torch.nn.Module, step: int, rows: slice,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """The mean squared error over ``rows`` weighted by their share of the batch: summed over
    the members, the gradient of the whole batch's mean."""
    inputs, target = batch(step, device)
    mine = {k: v[rows] for k, v in inputs.items()}
    out = model(**mine, return_dict=False)[0]
    return (out.float() - target[rows]).pow(2).mean() * ((rows.stop - rows.start) / ROWS)


def single_process(steps: int) -> list[dict]:
    """The uninterrupted run in this process: after each step, its gradients, weights and the
    bytes it holds at rest."""
    model = model_of()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    after = []
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss_on(model, step, slice(0, ROWS)).backward()
        gradients = full_gradients(model)
        optimizer.step()
        after.append({"gradients": gradients, "weights": full_weights(model),
                      "bytes": resting_bytes(model, optimizer)})
    return after


@dataclass(frozen=True)
class ShardedStep:
    """What each member of the group does: step ``step`` from a fresh model, or from the
    checkpoint in ``load_from``; its state written to ``save_to`` after."""

    step: int
    load_from: str | None = None
    save_to: str | None = None


def sharded_step(epoch: int, spec: ShardedStep) -> dict:
    """One member's part (a task pinned to it); every member returns the same whole
    gradients and weights, and the bytes each member holds."""
    peers = training.peers(epoch)
    torch.set_num_threads(1)
    with training.leaving_on_error(peers), as_default(peers.group):
        model = model_of()
        shard_module(model, peers.group, model.transformer_blocks)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        loaded = None
        if spec.load_from:
            load_sharded(model, optimizer, spec.load_from)
            loaded = full_weights(model)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_on(model, spec.step, share_of(ROWS, peers.rank, peers.world)).backward()
        gradients = full_gradients(model)
        optimizer.step()
        step_s = time.perf_counter() - started
        held = [None] * peers.world
        dist.all_gather_object(held, resting_bytes(model, optimizer))
        if spec.save_to:
            save_sharded(model, optimizer, spec.save_to)
        return {"gradients": gradients, "weights": full_weights(model), "bytes": held,
                "loaded": loaded, "step_s": step_s}


def largest_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise RuntimeError(f"bench sharded: the sharded step's tensors ({len(a)}) are not the "
                           f"single-process step's ({len(b)})")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@register_bench("sharded")
def bench_sharded(quick: bool = False, workers: int | None = None, **_: object) -> dict:
    """Exactness, memory and resume of sharded training on 2 and 4 gpu workers (--quick: 2
    and 3)."""
    workers = workers or (3 if quick else 4)
    if workers < 3:
        raise ValueError(f"--workers {workers}: the bench resumes a group of 2 on a larger "
                         "one; give at least 3")
    worlds = (2, workers)
    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="spotlight-bench-sharded-")
    reference = single_process(2)
    handle = start_embedded(ClusterConfig(gpu_workers=workers, spot_workers=0, dashboard=False,
                                          start_method="forkserver"),
                            log_file=run_log_file(f"file://{folder}").path)
    sizes, resumes, written = {}, [], {}
    with contextlib.closing(handle):
        client = handle.client
        while len(live_workers(client)) < workers:
            time.sleep(0.05)
        members = sorted(live_workers(client))
        group = training.TrainingGroup(client)
        for world in worlds:
            saved = f"file://{folder}/checkpoint-{world}"
            out = group.run(lambda: members[:world], sharded_step, ShardedStep(1, save_to=saved))
            written[world] = out["weights"]
            sizes[str(world)] = {
                "max_abs_diff": largest_diff(out["gradients"], reference[0]["gradients"]),
                "bytes_per_rank": out["bytes"],
                "bytes_per_rank_ratio": max(out["bytes"]) / reference[0]["bytes"],
                "step_s": out["step_s"]}
        for writer, resumed in ((worlds[0], worlds[1]), (worlds[1], worlds[0])):
            out = group.run(lambda: members[:resumed], sharded_step,
                            ShardedStep(2, load_from=f"file://{folder}/checkpoint-{writer}"))
            resumes.append({"written_by": writer, "resumed_by": resumed,
                            # what it loaded against what the writers held: the round trip
                            "loaded_max_abs_diff": largest_diff(out["loaded"], written[writer]),
                            "max_abs_diff": largest_diff(out["weights"],
                                                          reference[1]["weights"])})
    return {"bench": "sharded", "workers": workers, "lr": LR, "parameters": sum(
                t.numel() for t in reference[0]["weights"].values()),
            "unsharded_bytes": reference[0]["bytes"], "worlds": sizes, "resume": resumes,
            "max_abs_diff": max(s["max_abs_diff"] for s in sizes.values()),
            "resume_max_abs_diff": max(r["max_abs_diff"] for r in resumes),
            "training_group": group.log, "wall_s": time.monotonic() - started,
            "machine": machine()}
