"""Deterministic noise: every random number of a request comes from
(run seed, prompt id, sample seed, step index), per DESIGN's determinism contract.

Noise is drawn per sample from its own generator, so a sample's noise does not depend on which
batch it shares, on which worker it runs, or on whether it was preempted and resumed.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

INITIAL_STEP = -1  # the step index of the initial noise


def prompt_id(text: str) -> int:
    """Stable 63-bit id of a prompt's text (independent of file order)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def derive_seed(*parts: int) -> int:
    """Mix integers into a 63-bit generator seed (order matters; no collisions in practice)."""
    blob = b"".join(struct.pack("<q", int(p) & 0x7FFF_FFFF_FFFF_FFFF) for p in parts)
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class SampleKey:
    """Identity of one sample's randomness."""

    run_seed: int
    prompt_id: int
    sample_seed: int

    def noise(self, step: int, shape: tuple[int, ...]) -> torch.Tensor:
        gen = torch.Generator().manual_seed(derive_seed(self.run_seed, self.prompt_id,
                                                        self.sample_seed, step))
        return torch.randn(shape, generator=gen, dtype=torch.float32)


def batch_noise(keys: list[SampleKey], step: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Stack per-sample noise of ``step`` into a (B, *shape) tensor."""
    return torch.stack([k.noise(step, shape) for k in keys])
