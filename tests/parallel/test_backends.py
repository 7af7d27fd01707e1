"""Collectives over the device the model computes on: NCCL for CUDA tensors, gloo for host ones
(the selection, shown on CPU: this machine has no CUDA and its torch build no NCCL)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipelines.parallel import training
from spotlight.models.device import collective_backend
from spotlight.parallel.process_groups import close_group, open_group


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("meta", "gloo"),
                                             ("cuda", "nccl"), ("cuda:3", "nccl")])
def test_collectives_over_cuda_tensors_use_nccl_and_over_host_tensors_gloo(device, backend):
    assert collective_backend(torch.device(device)) == backend
    assert collective_backend(device) == backend


@pytest.fixture
def seat():
    yield training.seat()
    for joined in training.seat().peers.values():
        close_group(joined.group)
    training.seat().peers.clear()
    training.seat().hosted.clear()


@pytest.mark.parametrize("model_device", ["cpu", "auto"])
def test_the_training_group_of_a_cpu_worker_is_gloo(seat, model_device):
    host, port = training.open_training_rendezvous(1)
    training.join_training(1, 0, 1, host, port, model_device)
    group = training.peers(1).group
    assert group.name() == "gloo"
    assert training.group_size(1) == 1   # the all-reduce works over it
    # Registered with c10d (FSDP2's DeviceMesh is built over it) but not the default group:
    # an SP group of the same process may be.
    assert dist.get_process_group_ranks(group) == [0]
    assert not dist.is_initialized()


def test_the_training_group_of_a_cuda_worker_asks_for_nccl(seat, monkeypatch):
    """Where ``model.device`` resolves to CUDA, the group is NCCL's, bound to that device, on
    the same rendezvous, rank and size (recorded here, then made with gloo: the CPU build has
    no NCCL)."""
    asked = []

    def recording(backend, store, rank, world, name, timeout, device=None):
        asked.append((backend, type(store).__name__, rank, world, device))
        return open_group("gloo", store, rank, world, name, timeout)

    monkeypatch.setattr(training, "open_group", recording)
    monkeypatch.setattr(training, "resolve_device", lambda name: torch.device("cuda", 0))
    host, port = training.open_training_rendezvous(2)
    training.join_training(2, 0, 1, host, port, "auto")
    assert asked == [("nccl", "PrefixStore", 0, 1, torch.device("cuda", 0))]
    assert training.group_size(2) == 1
