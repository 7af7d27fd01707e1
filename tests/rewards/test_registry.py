"""The reward registry, batch checks and the NaN guard."""
from __future__ import annotations

import numpy as np
import pytest

from spotlight.config import RewardConfig
from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.rewards import REWARDS, build_reward, check_rewards, register_reward
from spotlight.rewards.recognizer import Recognizer

OCR_PROMPT = Prompt('a sign that says "7"', "ocr", target="7")
GENEVAL_PROMPT = Prompt("a 7", "geneval", include=(ObjectClause("7"),))


def test_both_rewards_are_registered() -> None:
    assert {"ocr", "geneval"} <= set(REWARDS)


def test_unknown_reward_name_lists_registered_ones() -> None:
    with pytest.raises(ValueError,
                       match=r"'clipscore'.*\['geneval', 'geneval-image', 'ocr'") as err:
        build_reward(RewardConfig(name="clipscore"))
    assert "RewardConfig.name" in str(err.value)


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_reward("ocr")(lambda config: None)


def test_check_rewards_rejects_nan_and_inf_naming_samples() -> None:
    with pytest.raises(ValueError, match=r"iteration 3.*\[1: nan, 3: inf\]"):
        check_rewards(np.array([0.5, np.nan, 1.0, np.inf]), where="iteration 3")
    values = check_rewards(np.array([0.0, 0.25, 1.0], np.float32), where="ok")
    assert values.dtype == np.float64 and values.tolist() == [0.0, 0.25, 1.0]


@pytest.mark.parametrize("name", ["ocr", "geneval"])
def test_reward_function_contract(recognizer: Recognizer, name: str) -> None:
    reward = build_reward(RewardConfig(name=name))
    assert reward.name == name
    assert reward.recognizer_accuracy == pytest.approx(recognizer.accuracy)
    prompt, other = (OCR_PROMPT, GENEVAL_PROMPT) if name == "ocr" else (GENEVAL_PROMPT, OCR_PROMPT)
    images = np.zeros((2, 3, 20, 32), np.float32)
    values = reward(images, [prompt, prompt])
    assert values.shape == (2,) and values.dtype == np.float64 and values.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 canvases but 1 prompts"):
        reward(images, [prompt])
    with pytest.raises(ValueError, match=f"scores '{name}' prompts.*\\[1\\]"):
        reward(images, [prompt, other])
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        reward(images[0], [prompt])
    images[1, 0, 3, 3] = np.nan
    with pytest.raises(ValueError, match=r"canvases \[1\].*NaN"):
        reward(images, [prompt, prompt])
