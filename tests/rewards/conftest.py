"""Shared fixtures: one recogniser trained per test session, in a throwaway cache."""
from __future__ import annotations

from pathlib import Path

import pytest

from spotlight.config import RewardConfig
from spotlight.rewards.recognizer import Recognizer, load_or_train_recognizer


@pytest.fixture(scope="session")
def reward_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for this session, so no test reads or writes the user's cache."""
    return tmp_path_factory.mktemp("spotlight-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(reward_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(reward_cache))


@pytest.fixture(scope="session")
def recognizer(reward_cache: Path) -> Recognizer:
    """The default-config recogniser, trained once (about ten seconds) and memoised in-process,
    so ``build_reward(RewardConfig())`` in later tests loads it instead of retraining."""
    defaults = RewardConfig()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPOTLIGHT_CACHE", str(reward_cache))
        # One thread: the suite shares two cores with other work, where OpenMP threads spin.
        return load_or_train_recognizer(defaults.recognizer_epochs, defaults.recognizer_seed,
                                        threads=1)
