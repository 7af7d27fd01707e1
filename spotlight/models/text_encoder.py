"""A small word-level prompt encoder for the digits world.

Words are lower-cased letter runs; every digit is its own token, so "407" reads as 4, 0, 7 and
the encoder sees digit order through its position embeddings. The vocabulary is fixed (it is
part of the saved model), so a checkpoint never depends on which prompts it first saw.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from spotlight.models.prompts import PALETTE, RELATIONS
from spotlight.models.world import NUMBER_WORDS, OCR_TEMPLATES

PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"[a-z]+|\d")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def build_vocabulary() -> list[str]:
    words = {PAD, UNK, "and", "s", *[str(d) for d in range(10)], *PALETTE, *NUMBER_WORDS.values()}
    for phrase in (*OCR_TEMPLATES, *RELATIONS, "one four five six seven eight nine zero"):
        words.update(tokenize(phrase))
    return [PAD, UNK] + sorted(words - {PAD, UNK})


class PromptEncoder(nn.Module):
    """Token + position embeddings and a few transformer layers -> (B, L, dim) and a mask."""

    def __init__(self, dim: int, layers: int, max_tokens: int) -> None:
        super().__init__()
        self.vocabulary = build_vocabulary()
        self.index = {w: i for i, w in enumerate(self.vocabulary)}
        self.max_tokens = max_tokens
        self.tokens = nn.Embedding(len(self.vocabulary), dim)
        self.positions = nn.Embedding(max_tokens, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=max(1, dim // 16), dim_feedforward=2 * dim,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = (nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                        if layers else None)

    def token_ids(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded token ids (B, L) and a bool mask of real tokens; L = longest prompt (capped)."""
        ids = [[self.index.get(w, 1) for w in tokenize(p)][: self.max_tokens] or [1]
               for p in prompts]
        length = max(len(row) for row in ids)
        out = torch.zeros(len(ids), length, dtype=torch.long)
        mask = torch.zeros(len(ids), length, dtype=torch.bool)
        for i, row in enumerate(ids):
            out[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = True
        return out, mask

    def forward(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.token_ids(prompts)
        ids, mask = ids.to(self.tokens.weight.device), mask.to(self.tokens.weight.device)
        h = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))[None]
        if self.encoder is not None:
            h = self.encoder(h, src_key_padding_mask=~mask)
        return h * mask[..., None], mask
