"""The collectives part: the training group's communicator on this device, and a sharded step.

A multi-GPU node's groups are NCCL's where the model computes on CUDA and gloo's on the CPU
(:func:`spotlight.models.device.collective_backend`). This part forms the group the way the
training group forms one (:func:`spotlight.parallel.process_groups.open_group`, on a TCP
rendezvous) -- one rank: NCCL refuses two ranks on one device, and a lent machine has one --
checks an all-reduce over it, then takes one sharded training step of ``bench sharded``'s tiny
real-format transformer over it (:mod:`spotlight.parallel.sharded`, FSDP2) against the same
step unsharded, in fp32 and with bf16 compute (mixed precision, as the anchors train).
"""
from __future__ import annotations

import copy
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pipelines.bench.sharded import ROWS, loss_on, model_of
from pipelines.gpu.record import Record
from spotlight.models.device import collective_backend
from spotlight.parallel.process_groups import as_default, close_group, open_group
from spotlight.parallel.sharded import full_gradients, shard_module

TIMEOUT = timedelta(seconds=60)


def sharded_step(group, device: torch.device, param_dtype: torch.dtype | None) -> dict:
    """One sharded step against the unsharded one: the largest gradient difference, times."""
    whole = model_of().to(device)
    sharded = copy.deepcopy(whole)
    shard_module(sharded, group, list(sharded.transformer_blocks), param_dtype)
    loss_on(whole, 1, slice(0, ROWS), device).backward()
    expected = full_gradients(whole)
    started = time.perf_counter()
    loss_on(sharded, 1, slice(0, ROWS), device).backward()
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-5)
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    got = full_gradients(sharded)
    return {"max_abs_diff": max(float((got[k] - expected[k]).abs().max()) for k in expected),
            "seconds": seconds, "param_dtype": str(param_dtype or "float32")}


def run_collectives(record: Record, device: str) -> None:
    where = torch.device(device)
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    backend = collective_backend(where)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=TIMEOUT)
    started = time.perf_counter()
    group = open_group(backend, dist.PrefixStore("check-gpu", store), 0, 1, "check-gpu",
                       TIMEOUT, where)
    try:
        ones = torch.ones(4, device=where)
        dist.all_reduce(ones, group=group)
        record.update("collectives.group", {
            "backend": backend, "world": group.size(), "device": str(where),
            "all_reduce_ok": bool((ones == 1).all()),
            "form_seconds": time.perf_counter() - started})
        with as_default(group):
            record.update("collectives.sharded_fp32", sharded_step(group, where, None))
            record.update("collectives.sharded_bf16", sharded_step(group, where,
                                                                   torch.bfloat16))
    finally:
        close_group(group)
