"""Shared fixtures: a private artefact cache and tiny configs that train in seconds."""
from __future__ import annotations

import pytest
import torch

from spotlight.config import ModelConfig, load_config


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Tests never read or write the user's cache; recogniser/base models are trained once per session."""
    path = tmp_path_factory.mktemp("spotlight-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTLIGHT_CACHE", str(path))
    torch.set_num_threads(2)
    yield path
    mp.undo()


TINY_MODEL = dict(num_layers=1, num_attention_heads=1, attention_head_dim=16, text_dim=16, text_layers=1)


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return ModelConfig(**TINY_MODEL)


@pytest.fixture
def tiny_config():
    """The default OCR config shrunk to train in seconds (same code paths)."""
    return load_config("configs/digits.yaml", {
        "model": TINY_MODEL,
        "pretrain.steps": 3, "pretrain.batch_size": 8, "pretrain.warmup_steps": 1,
        "grpo.prompts_per_iteration": 2, "grpo.group_size": 4, "grpo.micro_batch": 4,
        "sampler.num_steps": 4, "validation.max_prompts": 4, "validation.every": 1,
    })


def require_netns() -> None:
    """Network namespaces can be made here. Where they cannot the test skips with the reason
    -- except in CI (SPOTLIGHT_REQUIRE_NETNS=1, set by .ci/run, which runs as root), where
    that is a failure: a skipped partition test proves nothing."""
    import os

    from pipelines.bench.testbed import unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("SPOTLIGHT_REQUIRE_NETNS") == "1":
            pytest.fail(f"SPOTLIGHT_REQUIRE_NETNS=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture
def netns() -> None:
    require_netns()


@pytest.fixture
def testbed(netns):
    """A multi-host test bed (network namespaces; see ``require_netns``)."""
    from pipelines.bench.testbed import Testbed

    with Testbed() as bed:
        yield bed


@pytest.fixture(scope="module")
def module_testbed():
    """One test bed for a whole module, whose tests then run in file order on it, as the
    bench commands run their scenarios: a bed and its cluster cost tens of seconds each."""
    from pipelines.bench.testbed import Testbed

    require_netns()
    with Testbed() as bed:
        yield bed
