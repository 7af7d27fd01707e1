"""Gradient buckets: which tensors one all-reduce carries.

Summing gradients over a training group in one collective per tensor pays a round trip per
parameter (hundreds for a DiT); flattening all of them into one tensor pays a second copy of
every gradient -- 40 GB for a full Qwen-Image step in bf16. Buckets bound both: tensors
of one dtype, in order, flattened together up to a byte cap (torch's DDP caps at 25 MiB too).
"""
from __future__ import annotations

from collections.abc import Sequence

DEFAULT_BUCKET_BYTES = 25 * 2**20


def gradient_buckets(nbytes: Sequence[int], dtypes: Sequence[object],
                     cap_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Indices of the tensors each all-reduce carries, in order. A bucket holds one dtype and
    at most ``cap_bytes``, except a tensor larger than the cap, which goes alone. Every index
    is in exactly one bucket, so every gradient is summed exactly once."""
    if len(nbytes) != len(dtypes):
        raise ValueError(f"gradient_buckets got {len(nbytes)} sizes and {len(dtypes)} dtypes: "
                         "pass one of each per tensor")
    if cap_bytes < 1:
        raise ValueError(f"bucket cap {cap_bytes} bytes: give a positive number of bytes")
    open_by_dtype: dict[object, tuple[list[int], int]] = {}   # dtype -> (bucket, its bytes)
    buckets: list[list[int]] = []
    for index, (size, dtype) in enumerate(zip(nbytes, dtypes)):
        bucket, filled = open_by_dtype.get(dtype, (None, 0))
        if bucket is None or filled + size > cap_bytes:
            bucket, filled = [], 0
            buckets.append(bucket)
        bucket.append(index)
        open_by_dtype[dtype] = (bucket, filled + size)
    return buckets
