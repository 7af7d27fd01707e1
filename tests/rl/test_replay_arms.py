"""Exploration replays the validation keeps rank the rollout's own random process."""
from __future__ import annotations

import numpy as np
import torch

from spotlight.config import SamplerConfig, faithful_replay
from spotlight.exploration.fidelity import kendall_tau
from spotlight.models.policy import DigitsPolicy
from spotlight.models.prompts import Prompt
from spotlight.rl.sampler import sample
from spotlight.rl.trainer import sample_keys

SEEDS = 16


def _replay(policy, sampler: SamplerConfig, steps: int | None):
    prompt = Prompt('a sign that says "407"', "ocr", "407")
    keys = sample_keys(0, [prompt], np.arange(SEEDS)[None, :])
    return sample(policy, [prompt.text] * SEEDS, keys, sampler, mode="sde", num_steps=steps)


def _score(traj) -> np.ndarray:
    """A per-sample scalar of the final latent: what any reward ranks, in the small."""
    return traj.final.mean(dim=(1, 2)).double().numpy()


def test_a_kept_arm_replays_the_rollouts_window_exactly_and_ranks_like_it(tiny_model_config):
    torch.manual_seed(0)
    policy = DigitsPolicy(tiny_model_config, 12, 32).eval()
    sampler = SamplerConfig(num_steps=10, sde_window_start=0, sde_window_size=4)
    end = sampler.sde_window_end
    rollout = _replay(policy, sampler, None)
    kept = _replay(policy, sampler, 7)
    assert faithful_replay(sampler, 7)
    # Everything a seed decides (its noise at the window's sigmas) is the rollout's, bit for bit.
    assert torch.equal(kept.latents[:, :end + 1], rollout.latents[:, :end + 1])
    kept_tau = kendall_tau(_score(kept), _score(rollout))
    # The same 7-step budget on an all-SDE sampler coarsens the whole grid: its noise lands at
    # other sigmas, and it ranks the 16 seeds far less like its rollout (a random policy here;
    # on the trained digits model 0.89 against 0.49).
    all_sde = SamplerConfig(num_steps=10, sde_window_size=0)
    coarse_tau = kendall_tau(_score(_replay(policy, all_sde, 7)),
                             _score(_replay(policy, all_sde, None)))
    assert kept_tau > coarse_tau + 0.2, (kept_tau, coarse_tau)


def test_an_all_sde_sampler_makes_every_shorter_arm_another_process(tiny_model_config):
    torch.manual_seed(0)
    policy = DigitsPolicy(tiny_model_config, 12, 32).eval()
    sampler = SamplerConfig(num_steps=10, sde_window_size=0)   # every step stochastic
    assert not faithful_replay(sampler, 7) and faithful_replay(sampler, 0)
    rollout, coarse = _replay(policy, sampler, None), _replay(policy, sampler, 7)
    # The coarser grid puts its noise at other sigmas: already the first step differs.
    assert not torch.equal(coarse.latents[:, 1], rollout.latents[:, 1])

