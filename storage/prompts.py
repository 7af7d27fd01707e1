"""Prompt embeddings kept in the run store, so workers that only denoise (spot workers) read them
instead of loading a text encoder.

One object per prompt, ``prompts/<sha256 of the text>.npz``, holding the embedding and the
prompt text (checked on read: a hash collision or a foreign object is an error, not a wrong
condition). Written with one PUT, so a killed writer leaves the old state or the new one.
"""
from __future__ import annotations

import hashlib
import io

import numpy as np

from .errors import CorruptObjectError
from .urls import RunLocation

PROMPTS = "prompts"


def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:32] + ".npz"


class PromptEmbeddings:
    """Per-prompt arrays of one run (what the policy's ``embed_prompt`` returned)."""

    def __init__(self, location: RunLocation) -> None:
        self.location = location

    def put(self, prompt: str, embedding: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, embedding=np.asarray(embedding), prompt=np.asarray(prompt))
        self.location.write_bytes(buffer.getvalue(), PROMPTS, prompt_key(prompt))

    def has(self, prompt: str) -> bool:
        return self.location.exists(PROMPTS, prompt_key(prompt))

    def get(self, prompt: str) -> np.ndarray | None:
        """The stored embedding of ``prompt``, or None when none was stored."""
        try:
            data = self.location.read_bytes(PROMPTS, prompt_key(prompt))
        except FileNotFoundError:
            return None
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            if str(npz["prompt"]) != prompt:
                raise CorruptObjectError(
                    self.location.child_url(PROMPTS, prompt_key(prompt)),
                    f"it holds the embedding of {str(npz['prompt'])!r}, not of {prompt!r}; "
                    "delete it so the prompt is embedded again")
            return npz["embedding"]
