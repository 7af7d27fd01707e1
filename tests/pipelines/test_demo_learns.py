"""The demo's settings (``configs/digits-demo.yaml``: DiffusionNFT trained on the explored
samples, stale exploration, its learning rate and validation yardstick) raise the validation
reward, checked on the test-size world in the in-process executor of the iteration program.

The demo's own reward, OCR of rendered digits, needs the demo's model and about 30 iterations to
rise clearly (+0.048, 90% interval [+0.020, +0.076], docs/results.md); on the test-size world
ten iterations of it moved the validation by less than its noise (measured 2026-11-29: 0.091 ->
0.099, 0.096 -> 0.109, with dips between). So the test swaps in rewards whose optimum is known
-- bright canvases, then dark ones -- and asks the demo's settings to follow each: a flipped
advantage, rewards filed against the wrong samples, or an objective that ignores them cannot
move the validation up under both. The validation gain is the demo's own
(:func:`pipelines.front.demo.validation_gain`: the same prompts and seeds before and after,
with a bootstrap interval), so no threshold on time or on the size of the gain is involved.
"""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.front.demo import validation_gain
from pipelines.run.inprocess import InProcessRun
from spotlight.config import PROJECT_ROOT, load_config
from spotlight.rewards import REWARDS, register_reward
from tests.pipelines.conftest import TINY_RUN

DEMO = PROJECT_ROOT / "configs" / "digits-demo.yaml"
# The test-size world (the pipeline tests' model, pretraining and sampler) with the demo's
# objective, mode and learning rate; in process, exploration runs without a clock or planner.
TEST_SIZE = {
    **{f"model.{k}": v for k, v in TINY_RUN["model"].items()},
    **{f"pretrain.{k}": v for k, v in TINY_RUN["pretrain"].items()},
    "sampler.num_steps": TINY_RUN["sampler"]["num_steps"],
    "grpo.prompts_per_iteration": 4,
    "validation.max_prompts": 16,
    "planner.enabled": False,
    "exploration.deadline": False,
}
ITERATIONS = 6


class Brightness:
    """The mean pixel value, or one minus it (``dark``): rewards with a known optimum."""

    recognizer_accuracy = float("nan")

    def __init__(self, dark: bool) -> None:
        self.dark, self.name = dark, "test-darkness" if dark else "test-brightness"

    def __call__(self, images: np.ndarray, prompts) -> np.ndarray:
        mean = np.asarray(images, np.float64).mean(axis=(1, 2, 3))
        return 1.0 - mean if self.dark else mean


@pytest.fixture
def known_rewards():
    names = {"test-brightness": False, "test-darkness": True}
    for name, dark in names.items():
        register_reward(name)(lambda config, dark=dark: Brightness(dark))
    yield list(names)
    for name in names:
        REWARDS.pop(name, None)


def test_the_demos_settings_raise_the_validation_reward_whichever_way_it_points(known_rewards):
    gains = {}
    for reward in known_rewards:
        config = load_config(str(DEMO), {**TEST_SIZE, "reward.name": reward})
        assert config.objective.kind == "nft" and config.objective.train_on_explored
        run = InProcessRun(config, config.mode)
        try:
            run.validate(0)
            before = run.last_validation
            run.run_iterations(ITERATIONS)
            after = run.last_validation
        finally:
            run.close()
        assert after is not before   # the last iteration validated its weights
        gains[reward] = validation_gain(before, after)
    for reward, gain in gains.items():
        assert gain["pairs"] == 16 * 4 and gain["ci90"][0] > 0, gains
