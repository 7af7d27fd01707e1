"""The validation mean's standard error, prompts as the unit, on hand-computed values."""
import math

import numpy as np

from spotlight.rl.validation import standard_error


def test_the_standard_error_counts_prompts_not_samples():
    # Prompt means 0.2, 0.4, 0.6 (each from two seeds): their std (ddof 1) is 0.2, over sqrt 3.
    rewards = np.array([[0.1, 0.3], [0.4, 0.4], [0.5, 0.7]])
    assert math.isclose(standard_error(rewards), 0.2 / math.sqrt(3))
    # More seeds of the same prompts do not shrink it; more prompts do.
    assert math.isclose(standard_error(np.repeat(rewards, 4, axis=1)), 0.2 / math.sqrt(3))
    assert standard_error(np.tile(rewards, (4, 1))) < standard_error(rewards)
    assert math.isnan(standard_error(np.array([[0.5, 0.6]])))
