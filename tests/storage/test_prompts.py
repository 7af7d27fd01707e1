"""Prompt embeddings in the run store: one object per prompt, read back exactly, checked."""
from __future__ import annotations

import numpy as np
import pytest

from storage import CorruptObjectError, RunStore
from storage.prompts import PROMPTS, prompt_key


def test_embeddings_round_trip_and_a_missing_prompt_is_none(store_config):
    store = RunStore.open(store_config, writer=True)
    embedding = np.random.default_rng(0).standard_normal((7, 32)).astype(np.float32)
    assert store.prompts.get('a sign that says "12"') is None
    store.prompts.put('a sign that says "12"', embedding)
    assert store.prompts.has('a sign that says "12"') and not store.prompts.has("other")
    again = RunStore.open(store_config, create=False).prompts.get('a sign that says "12"')
    assert again.dtype == np.float32
    np.testing.assert_array_equal(again, embedding)


def test_an_object_holding_another_prompt_is_refused(store_config):
    store = RunStore.open(store_config, writer=True)
    store.prompts.put("first", np.zeros((2, 4), np.float32))
    data = store.location.read_bytes(PROMPTS, prompt_key("first"))
    store.location.write_bytes(data, PROMPTS, prompt_key("second"))
    with pytest.raises(CorruptObjectError, match="not of 'second'"):
        store.prompts.get("second")
