"""The training objective: Flow-GRPO's policy gradient, or a forward-process objective.

``flow-grpo`` trains on the SDE rollout's per-step log-probabilities (PPO-clipped ratios); its
few-step variant (Flow-GRPO-Fast, MixGRPO) is the same objective with a narrow
``sampler.sde_window_size``: ODE steps outside the window, and only the window's steps trained.
``nft`` is a forward-process objective in the manner of DiffusionNFT: the rollout's clean
samples are re-noised at fresh noise levels and trained with the flow-matching loss, pulled
toward an implicit positive policy in proportion to the reward and away through a negative one;
``awm`` (Advantage Weighted Matching) trains the same re-noised samples with the pretraining
loss weighted by each sample's advantage. Neither needs log-probabilities, so any sampler may
produce the samples.
"""
from __future__ import annotations

from dataclasses import dataclass

from spotlight.config.base import ConfigError, Validated, spec

OBJECTIVES = ("flow-grpo", "nft", "awm")
FORWARD_PROCESS = ("nft", "awm")   # trained on clean samples alone: no log-probabilities


@dataclass(kw_only=True, frozen=True)
class ObjectiveConfig(Validated):
    """What the train stage optimises (the rollout, rewards and group advantages are shared)."""

    kind: str = spec("flow-grpo", "'flow-grpo' = PPO-clipped policy gradient on the SDE steps' "
                                  "log-probabilities (narrow sampler.sde_window_size for the "
                                  "Flow-GRPO-Fast / MixGRPO variant); 'nft' = forward-process "
                                  "flow matching toward reward-weighted implicit positive and "
                                  "negative policies (DiffusionNFT's objective); 'awm' = the "
                                  "pretraining flow-matching loss weighted by each sample's "
                                  "advantage (Advantage Weighted Matching).",
                     choices=OBJECTIVES)
    nft_beta: float = spec(1.0, "nft: how far the implicit policies sit from the sampling "
                                "policy: v+ = (1 - b) v_old + b v, v- = (1 + b) v_old - b v.",
                           range=(1e-3, 10.0))
    nft_timesteps: int = spec(4, "nft: noise levels each sample is trained at per iteration, "
                                 "one per equal slice of [nft_sigma_min, 1).",
                              range=(1, 1000))
    nft_sigma_min: float = spec(0.02, "nft: lowest noise level trained (near 0 the loss only "
                                      "sees pixels, not structure).", range=(0.0, 0.99))
    awm_timesteps: int = spec(4, "awm: noise levels each sample is trained at per iteration, "
                                 "one per equal slice of the logit-normal law.",
                              range=(1, 1000))
    awm_time_shift: float = spec(1.0, "awm: shift of the noise levels toward noise, as "
                                      "pretraining's timestep shift (s -> k s / (1 + (k - 1) "
                                      "s)); 1 = the plain logit-normal.", range=(0.1, 20.0))
    sampling_ema: float = spec(
        0.0, "nft and awm (flow-grpo ignores it): the sampling policy as a moving average of "
             "the trained weights (DiffusionNFT's soft update): after each step phi <- e phi + "
             "(1 - e) theta, and rollouts, exploration, validation and the loss's v_old use phi "
             "while the optimizer steps theta. 0 = sample with the trained weights themselves "
             "(on-policy).",
        range=(0.0, 0.999))
    sampling_ema_ramp: int = spec(
        0, "nft and awm: iterations over which sampling_ema's e rises linearly from 0 to its "
           "value (early iterations stay near on-policy); 0 = e from the first iteration.",
        range=(0, 100000))
    train_on_explored: bool = spec(
        False, "nft and awm: an iteration whose seeds were chosen among explored candidates "
               "trains on those candidates' samples and exploration rewards as they are (drawn "
               "with the weights that explored them, at the exploration's steps) instead of "
               "rolling the seeds out again: no rollout or reward stage on its critical path. "
               "Prompts left unexplored are rolled out alone and joined (partial reuse).")

    def validate(self) -> None:
        if self.train_on_explored and self.kind not in FORWARD_PROCESS:
            raise ConfigError(
                f"objective.train_on_explored needs samples it may train on without their "
                f"log-probabilities under the current weights, but objective.kind = "
                f"{self.kind!r} trains on those; set objective.kind: nft or awm, or "
                f"objective.train_on_explored: false")
