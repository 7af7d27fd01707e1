"""Collectives over the device the model computes on: NCCL for CUDA tensors, gloo for host ones
(the selection, shown on CPU: this machine has no CUDA and its torch build no NCCL)."""
from __future__ import annotations

import pytest
import torch

from pipelines.parallel import training
from spotlight.models.device import collective_backend


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("meta", "gloo"),
                                             ("cuda", "nccl"), ("cuda:3", "nccl")])
def test_collectives_over_cuda_tensors_use_nccl_and_over_host_tensors_gloo(device, backend):
    assert collective_backend(torch.device(device)) == backend
    assert collective_backend(device) == backend


@pytest.fixture
def seat():
    yield training.seat()
    training.seat().peers.clear()
    training.seat().hosted.clear()


@pytest.mark.parametrize("model_device", ["cpu", "auto"])
def test_the_training_group_of_a_cpu_worker_is_gloo(seat, model_device):
    host, port = training.open_training_rendezvous(1)
    training.join_training(1, 0, 1, host, port, model_device)
    assert training.peers(1).group.name() == "gloo"
    assert training.group_size(1) == 1   # the all-reduce works over it


def test_the_training_group_of_a_cuda_worker_asks_for_nccl(seat, monkeypatch):
    """Where ``model.device`` resolves to CUDA, the group is NCCL's (a recording stand-in here:
    the CPU build has no NCCL), on the same rendezvous, rank and size."""
    made = []

    class RecordingNCCL:
        def __init__(self, store, rank, world):
            made.append((type(store).__name__, rank, world))

        def _set_default_timeout(self, timeout):
            made.append(timeout)

    monkeypatch.setattr(training.dist, "ProcessGroupNCCL", RecordingNCCL, raising=False)
    monkeypatch.setattr(training, "resolve_device", lambda name: torch.device("cuda", 0))
    host, port = training.open_training_rendezvous(2)
    training.join_training(2, 0, 1, host, port, "auto")
    assert made == [("PrefixStore", 0, 1), training.STEP_TIMEOUT]
    assert isinstance(training.peers(2).group, RecordingNCCL)
