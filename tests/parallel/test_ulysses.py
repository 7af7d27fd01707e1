"""Ulysses attention on real gloo process groups: an SP group of 2 or 4 processes computes the
single-process forward (and, for 2, the gradients) of a real QwenImageTransformer2DModel."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from spotlight.parallel.ulysses import SequenceParallelError, check_degree, shard_bounds
from tests.parallel.sp_worker import member
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)


def run_group(world: int, tmp_path, backward: bool = False) -> list[dict]:
    mp.start_processes(member, args=(world, free_port(), str(tmp_path), backward),
                       nprocs=world, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


def test_an_sp_group_of_four_computes_the_single_process_forward(tmp_path):
    for result in run_group(4, tmp_path):
        assert result["diff"] <= 1e-5
        assert result["after_disable"] == 0.0


def test_an_sp_group_of_two_computes_the_single_process_forward_and_gradients(tmp_path):
    for result in run_group(2, tmp_path, backward=True):
        assert result["diff"] <= 1e-5
        assert result["grad_diff"] <= 1e-5
        assert result["after_disable"] == 0.0


def test_shards_are_contiguous_and_cover_the_sequence():
    assert [shard_bounds(24, 4, r) for r in range(4)] == [(0, 6), (6, 12), (12, 18), (18, 24)]


def test_an_impossible_degree_is_named_with_what_would_work():
    with pytest.raises(SequenceParallelError, match="does not divide the model's 4 attention "
                                                     "heads.*1, 2, 4"):
        check_degree(3, heads=4)
    with pytest.raises(SequenceParallelError, match="25 image tokens"):
        check_degree(2, heads=4, image_tokens=25)
    with pytest.raises(SequenceParallelError, match="only 2 are configured"):
        check_degree(4, heads=4, image_tokens=24, devices=2)
