"""Placement of a policy's tensors: the device ``model.device`` names, and moving tensors onto
it without stopping the GPU.

A copy from the host to a CUDA device goes through pinned memory and does not wait
(``non_blocking``): torch's plain ``.to("cuda")`` from pageable memory synchronises with the
device, which in a denoising loop would serialise every step behind the host. The copy back
(latents streamed to storage) is the latent sink's (:mod:`storage.sink`).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager

import torch


class DeviceError(ValueError):
    """``model.device`` names a device this worker does not have."""


def resolve_device(name: str) -> torch.device:
    """``model.device`` on this worker: 'auto' is CUDA where there is a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"model.device = {name!r}, but this worker has no CUDA device "
                              f"(torch {torch.__version__}); set model.device: auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"model.device = {name!r}, but this worker has "
                              f"{torch.cuda.device_count()} CUDA device(s): cuda:0 to "
                              f"cuda:{torch.cuda.device_count() - 1}")
    return device


def collective_backend(device: torch.device) -> str:
    """The ``torch.distributed`` backend for collectives over tensors on ``device``: NCCL on
    CUDA (device to device, over NVLink or the network, with no copy through the host), gloo on
    the CPU. NCCL also refuses two ranks on one device, so a node runs a worker per GPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def module_device(module: Any) -> torch.device:
    """Where ``module`` computes: its ``device`` attribute, else its first parameter's device,
    else the CPU (a policy without parameters)."""
    device = getattr(module, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(module, "parameters", None)
    if parameters is not None:
        for p in parameters():
            return p.device
    return torch.device("cpu")


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a host tensor bound for CUDA is pinned and copied without
    waiting (the caching host allocator keeps the pinned block until the copy has run)."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def autocast(device: torch.device, dtype: torch.dtype) -> ContextManager:
    """bfloat16/float16 autocast on CUDA for weights of that dtype -- as diffusers' LoRA
    training runs a half-precision transformer whose fp32 adapter must not force fp32
    matmuls -- and nothing on the CPU or in float32 (results there stay bit for bit)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        return torch.autocast("cuda", dtype=dtype)
    return nullcontext()


def place(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module.to(device)``, and the plain tensor attributes ``to`` leaves behind (diffusers'
    RoPE tables), so that nothing of the module is copied to the device at each call."""
    module.to(device)
    for sub in module.modules():
        for key, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and value.device != device:
                setattr(sub, key, value.to(device))
    return module


def tensors_off(module: torch.nn.Module, device: torch.device) -> list[str]:
    """Every parameter, buffer and plain tensor attribute of ``module`` and its submodules that
    is not on ``device`` (what a placement missed), by name."""
    off = [f"{name} ({t.device})" for name, t in [*module.named_parameters(),
                                                   *module.named_buffers()]
           if t.device.type != device.type]
    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and value.device.type != device.type:
                off.append(f"{prefix}.{key} ({value.device})".lstrip("."))
    return off
