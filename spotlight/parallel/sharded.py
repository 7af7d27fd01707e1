"""Sharded training with FSDP2: parameters, gradients and optimizer state split over a group.

Data-parallel training (:mod:`pipelines.parallel.training`) keeps a whole copy of the trained
weights, their gradients and AdamW's two moments on every member -- 16 bytes a parameter in
fp32, which is what keeps full fine-tuning of a 20 B transformer off one device. Here each
member holds ``1/world`` of each (``torch.distributed.fsdp.fully_shard``): a block's weights are
gathered for its forward and backward only, and its gradients are reduce-scattered, so each
member steps the optimizer on its own shard.

The step is the data-parallel one: every member computes its share of each micro-batch,
weighted by its size, and the gradients are *summed* over the group (FSDP2 averages by
default; :func:`shard_module` makes it sum, with sum-only collectives, which gloo has), so the
step equals the single-process step up to the order of the sum.

A sharded checkpoint is one ``torch.distributed.checkpoint`` folder written by every member
through fsspec (a local folder or object storage); it loads on any number of members -- DCP
reshards on load -- so a group that lost a member re-forms and resumes from it. It holds
tensors only, which DCP reads with ``torch.load(weights_only=True)``: nothing is unpickled.

Everything here runs with the training group as the default group
(:func:`spotlight.parallel.process_groups.as_default`): DeviceMesh, FSDP2 and DCP ask the
default group for this process's rank.
"""
from __future__ import annotations

import warnings
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn


def shard_module(module: nn.Module, group: dist.ProcessGroup, blocks: Iterable[nn.Module],
                 param_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard ``module`` over ``group`` in place: each of ``blocks`` (e.g. a transformer's
    blocks; each is gathered alone, so the peak is one block's weights) and the rest of
    ``module``. ``param_dtype``: the dtype forward and backward compute in (mixed precision,
    as the anchors train: bf16 compute over fp32 shards); gradients are reduced in fp32."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # A diffusers transformer returns its output in a tuple, as a view; the trainers use it out
    # of place, which is what FSDP2's warning (printed on every forward) asks.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    device = next(module.parameters()).device
    # Meshes over the same ranks are equal unless named apart, and DTensor's caches would hand
    # a later group's tensors an earlier (closed) group's mesh: each group's mesh is its own.
    mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=(f"shard-{group.group_name}",))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)   # a sum, as data-parallel training
            unit.set_force_sum_reduction_for_comms(True)   # gloo has no PREMUL_SUM
    return module


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def resting_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes this member holds at rest for ``module``'s training: its parameters, their
    gradients and the optimizer's state (a sharded tensor counts its local shard)."""
    tensors = [p for p in module.parameters()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values()
                    if isinstance(v, torch.Tensor)]
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def full_tensors(named: Iterable[tuple[str, torch.Tensor | None]]) -> dict[str, torch.Tensor]:
    """Each sharded tensor gathered whole (a collective: every member calls it), on the host."""
    out = {}
    for name, tensor in named:
        if tensor is not None:
            whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            out[name] = whole.detach().cpu()
    return out


def full_gradients(module: nn.Module) -> dict[str, torch.Tensor]:
    return full_tensors((n, p.grad) for n, p in module.named_parameters())


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return full_tensors(module.named_parameters())


def save_sharded(module: nn.Module, optimizer: torch.optim.Optimizer, url: str,
                 storage_options: dict | None = None, weights: bool = True) -> None:
    """Every member writes its shards of the optimizer state (and, with ``weights``, of the
    weights) to folder ``url`` (any fsspec URL) as one ``torch.distributed.checkpoint``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    held, moments = get_state_dict(module, optimizer)
    # Tensors only: DCP unpickles any other value it reads back, and the param groups (the
    # learning rate, betas) come from the run's config on load anyway.
    state = {"optimizer": {"state": moments["state"]}} | ({"model": held} if weights else {})
    dcp.save(state, storage_writer=FsspecWriter(url, **(storage_options or {})))


def load_sharded(module: nn.Module, optimizer: torch.optim.Optimizer, url: str,
                 storage_options: dict | None = None, weights: bool = True) -> None:
    """Load the checkpoint in ``url`` into a sharded ``module`` (with ``weights``) and its
    ``optimizer``, on however many members it was written by (each reads its shards' parts)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    reader = FsspecReader(url, **(storage_options or {}))
    held, moments = get_state_dict(module, optimizer)
    # The template has optimizer state for every parameter; AdamW keeps none for a parameter
    # that never had a gradient (a block's unused output), so the checkpoint has none either.
    stored = {key.rsplit(".", 1)[0] for key in reader.read_metadata().state_dict_metadata}
    state = {"optimizer": {"state": {name: values for name, values in moments["state"].items()
                                     if f"optimizer.state.{name}" in stored}}}
    state |= {"model": held} if weights else {}
    dcp.load(state, storage_reader=reader)
    moments["state"] = state["optimizer"]["state"]   # with this optimizer's param groups
    if weights:
        set_model_state_dict(module, state["model"])   # strict: every weight is in the folder
    set_optimizer_state_dict(module, optimizer, moments,
                             options=StateDictOptions(strict=False))   # those moments may not
