"""Gradient buckets: every tensor summed once, a bucket one dtype and at most the cap; and the
training group's all-reduce, bucketed, sums what one flat all-reduce sums (two gloo members)."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from pipelines.parallel.training import GroupPeers
from spotlight.parallel.buckets import gradient_buckets


def test_buckets_hold_one_dtype_up_to_the_cap_and_cover_every_tensor_once():
    sizes = [40, 40, 30, 100, 10, 10]
    dtypes = ["f32", "f32", "bf16", "f32", "f32", "bf16"]
    buckets = gradient_buckets(sizes, dtypes, cap_bytes=80)
    assert buckets == [[0, 1], [2, 5], [3], [4]]
    assert sorted(i for b in buckets for i in b) == list(range(len(sizes)))
    for bucket in buckets:
        assert len({dtypes[i] for i in bucket}) == 1
        assert sum(sizes[i] for i in bucket) <= 80 or len(bucket) == 1


def test_a_large_cap_gives_one_bucket_per_dtype():
    assert gradient_buckets([4] * 5, ["a", "b", "a", "b", "a"], cap_bytes=10**9) == [
        [0, 2, 4], [1, 3]]
    assert gradient_buckets([], []) == []


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="2 sizes and 1 dtypes"):
        gradient_buckets([1, 2], ["a"])
    with pytest.raises(ValueError, match="positive number of bytes"):
        gradient_buckets([1], ["a"], cap_bytes=0)


def gradients(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(shape, generator=g).to(dtype) for shape, dtype in
            [((7, 3), torch.float32), ((5,), torch.float64), ((33,), torch.float32),
             ((2, 2), torch.float64), ((9,), torch.float32)]]


def summed_on_two_members(bucket_bytes: int) -> list[list[torch.Tensor]]:
    store, out = dist.HashStore(), {}

    def member(rank: int) -> None:
        group = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, 2,
                                      timedelta(seconds=60))
        tensors = gradients(rank)
        GroupPeers(group, rank, 2, bucket_bytes).all_reduce(tensors)
        out[rank] = tensors

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [out[0], out[1]]


def test_the_bucketed_all_reduce_sums_every_gradient_over_the_group():
    expected = [a + b for a, b in zip(gradients(0), gradients(1))]
    for cap in (64, 10**9):   # many small buckets, and one per dtype
        for tensors in summed_on_two_members(cap):
            assert [t.dtype for t in tensors] == [t.dtype for t in expected]
            for got, want in zip(tensors, expected):
                assert torch.equal(got, want)
