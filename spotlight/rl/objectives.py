"""The trainers a run can optimise with (``objective.kind``), built by one function.

All share the rollout, the rewards, the group advantages, the micro-batch loop, data-parallel
peers and the optimizer (:class:`~spotlight.rl.trainer.FlowGRPO`); the forward-process trainers
(DiffusionNFT's, and AWM's on top of it) replace only what one micro-batch's loss is and what it
needs computed first.
"""
from __future__ import annotations

import numpy as np
import torch

from spotlight.models.device import module_device, to_device
from spotlight.rl.awm import awm_sigmas, matching_log_likelihood
from spotlight.rl.grpo import Advantages, ppo_clipped_loss
from spotlight.rl.nft import (
    nft_loss,
    noised,
    optimality,
    sampling_decay,
    soft_update_,
    training_noise,
    training_sigmas,
)
from spotlight.rl.sampler import Trajectory
from spotlight.rl.trainer import ZERO_STATS, FlowGRPO, Rollout

# The training state's key for the trained weights theta, where they differ from the sampling
# weights the checkpoint holds (objective.sampling_ema).
TRAINED_WEIGHTS = "trained_weights"


class ForwardProcessTrainer(FlowGRPO):
    """DiffusionNFT's objective (:mod:`spotlight.rl.nft`) on the rollout's clean samples.

    The sampling policy's velocity v_old at each (sample, noise level) is that of the weights
    the rollout was sampled with -- the ones this trainer holds when the train stage starts.
    A row in the first micro-batch is trained before any optimizer step, so its v_old is the
    velocity its own forward pass computes; only the rows first trained after a step need a
    forward pass of their own beforehand (none with one micro-batch per iteration: the
    shipped configs). ``approx_kl`` reports the mean squared drift of the velocity from v_old,
    and ``clip_fraction`` is 0: nothing is clipped.

    With ``objective.sampling_ema`` the weights the run samples with (phi, the policy's
    parameters between steps, and the checkpoint's weights) are a moving average of the weights
    the optimizer steps (theta, held aside here and in the checkpoint's training state): a step
    swaps theta in, computes every row's v_old under phi first, and leaves phi behind."""

    trained: list[torch.Tensor] | None = None   # theta when it differs from phi (None: equal)
    sampling: list[torch.Tensor] | None = None  # phi, during a step that trains theta

    def training_state(self) -> dict:
        state = super().training_state()
        if self.trained is None:
            return state
        return {**state, TRAINED_WEIGHTS: list(self.trained)}

    def load_training_state(self, state: dict | None) -> None:
        state = dict(state or {})
        trained = state.pop(TRAINED_WEIGHTS, None)
        self.trained = None if trained is None else [
            t.to(p.device, p.dtype) for t, p in zip(trained, self.parameters)]
        self.sampling = None
        super().load_training_state(state or None)

    def train(self, rollout: Rollout, advantages: Advantages, iteration: int) -> dict[str, float]:
        objective = self.config.objective
        if objective.sampling_ema == 0:
            return super().train(rollout, advantages, iteration)
        self.sampling = [p.detach().clone() for p in self.parameters]   # phi_v
        if self.trained is not None:
            _load_into(self.parameters, self.trained)
        stats = super().train(rollout, advantages, iteration)
        decay = sampling_decay(objective.sampling_ema, objective.sampling_ema_ramp, iteration)
        soft_update_(self.sampling, self.parameters, decay)
        self.trained = [p.detach().clone() for p in self.parameters]    # theta_v+1
        _load_into(self.parameters, self.sampling)                        # phi_v+1
        self.sampling = None
        return stats

    def trained_steps(self, rollout: Rollout, iteration: int) -> list[int]:
        """Here: indices into the iteration's noise levels (every one is trained)."""
        return list(range(self.config.objective.nft_timesteps))

    def noise_levels(self, iteration: int, count: int) -> list[float]:
        """The iteration's ``count`` noise levels, every sample trained at each."""
        return training_sigmas(self.config.seed, iteration, count,
                               self.config.objective.nft_sigma_min)

    def sample_weights(self, adv: torch.Tensor) -> torch.Tensor:
        """What the loss weighs each row of a micro-batch by, once per micro-batch: here its
        optimality probability r (from its clipped advantage)."""
        return torch.from_numpy(optimality(adv.numpy(), self.config.grpo.adv_clip_max)).float()

    def sample_loss(self, velocity: torch.Tensor, old: torch.Tensor, target: torch.Tensor,
                    weights: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Per-sample loss at one noise level, and the share of samples clipped (none here)."""
        return nft_loss(velocity, old, target, weights, self.config.objective.nft_beta), 0.0

    def prepare(self, rollout: Rollout, batches: list[np.ndarray], steps: list[int],
                iteration: int) -> None:
        traj = rollout.trajectory
        self.sigmas = self.noise_levels(iteration, len(steps))
        shape = tuple(traj.final.shape[1:])
        self.noise = training_noise(self.config.seed, iteration, len(traj.final), len(steps), shape)
        self.old_velocity = torch.zeros_like(self.noise)
        self.old_known = torch.zeros(len(traj.final), dtype=torch.bool)
        self.stepped = False
        first = set(self.my_rows(batches[0]).tolist()) if batches else set()
        later = {int(row) for batch in batches[1:] for row in self.my_rows(batch)} - first
        if self.sampling is None:
            self._old_velocities(rollout, np.array(sorted(later), dtype=np.int64))
            return
        # The weights stepped are not the sampling policy's: every row's v_old under phi.
        trained = [p.detach().clone() for p in self.parameters]
        _load_into(self.parameters, self.sampling)
        self._old_velocities(rollout, np.array(sorted(first | later), dtype=np.int64))
        _load_into(self.parameters, trained)

    def _old_velocities(self, rollout: Rollout, rows: np.ndarray) -> None:
        """v_old of ``rows`` at every noise level, with the weights held now."""
        device, traj = module_device(self.policy), rollout.trajectory
        self.policy.eval()
        with torch.no_grad():
            for start in range(0, len(rows), self.config.grpo.micro_batch):
                idx = torch.from_numpy(rows[start:start + self.config.grpo.micro_batch])
                texts = [rollout.prompts[i].text for i in idx]
                x0, text = to_device(traj.final[idx], device), self.policy.encode(texts)
                for j, sigma in enumerate(self.sigmas):
                    x, _ = noised(x0, to_device(self.noise[idx, j], device), sigma)
                    v = self.policy.velocity(x, self._sigma(sigma, device), text)
                    self.old_velocity[idx, j] = v.float().cpu()
        self.old_known[torch.from_numpy(rows)] = True

    def _update(self, traj: Trajectory, idx: torch.Tensor, adv: torch.Tensor, texts: list[str],
                steps: list[int]) -> dict[str, float]:
        out = super()._update(traj, idx, adv, texts, steps)
        self.stepped = True
        return out

    @staticmethod
    def _sigma(sigma: float, device) -> torch.Tensor:
        return torch.tensor([sigma], dtype=torch.float32, device=device)

    def _backward(self, traj: Trajectory, idx: torch.Tensor, adv: torch.Tensor, texts: list[str],
                  steps: list[int], share: float) -> dict[str, float]:
        """Accumulate the gradient of ``share`` x the mean NFT loss over rows ``idx``."""
        grpo = self.config.grpo
        device = module_device(self.policy)
        x0 = to_device(traj.final[idx], device).float()
        weights = to_device(self.sample_weights(adv.cpu()), device)
        text, ref_text = self.encode_prompts(texts)
        known = self.old_known[idx]
        if not bool(known.all()) and self.stepped:
            raise RuntimeError("v_old of a row first trained after an optimizer step was not "
                               "computed beforehand (prepare's micro-batches differ)")
        out = dict(ZERO_STATS)
        for j in steps:
            sigma = self.sigmas[j]
            x, target = noised(x0, to_device(self.noise[idx, j], device), sigma)
            v = self.policy.velocity(x, self._sigma(sigma, device), text).float()
            # Before the first step the weights are the sampling policy's: v is v_old.
            self.old_velocity[idx[~known], j] = v.detach()[~known.to(v.device)].cpu()
            old = to_device(self.old_velocity[idx, j], device)
            per_sample, clipped = self.sample_loss(v, old, target, weights)
            loss = per_sample.mean() * share
            if self.reference is not None:
                with torch.no_grad():
                    ref = self.reference.velocity(x, self._sigma(sigma, device), ref_text).float()
                kl = ((v - ref) ** 2).mean() * share
                loss = loss + grpo.beta_kl * kl
                out["kl_to_reference"] += kl.item() / len(steps)
            (loss / len(steps)).backward(retain_graph=grpo.trainable == "all")
            out["loss"] += loss.item() / len(steps)
            out["approx_kl"] += float(((v.detach() - old) ** 2).mean()) * share / len(steps)
            out["clip_fraction"] += clipped * share / len(steps)
        self.old_known[idx] = True
        return out


def _load_into(parameters: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """Copy ``values`` into the parameters in place (the optimizer keeps its references)."""
    with torch.no_grad():
        for p, v in zip(parameters, values):
            p.copy_(v)


class AdvantageWeightedTrainer(ForwardProcessTrainer):
    """Advantage Weighted Matching (:mod:`spotlight.rl.awm`): the pretraining flow-matching
    loss on each clean sample, at noise levels drawn as pretraining draws them, weighted by the
    sample's advantage through Flow-GRPO's clipped ratio on its flow-matching likelihood. The
    sampling policy's velocities (for the ratio's denominator), the re-noising and the KL to
    the reference are the forward-process trainer's."""

    def trained_steps(self, rollout: Rollout, iteration: int) -> list[int]:
        return list(range(self.config.objective.awm_timesteps))

    def noise_levels(self, iteration: int, count: int) -> list[float]:
        return awm_sigmas(self.config.seed, iteration, count, self.config.objective.awm_time_shift)

    def sample_weights(self, adv: torch.Tensor) -> torch.Tensor:
        """Here: the advantage itself."""
        return adv.float()

    def sample_loss(self, velocity: torch.Tensor, old: torch.Tensor, target: torch.Tensor,
                    weights: torch.Tensor) -> tuple[torch.Tensor, float]:
        loss, stats = ppo_clipped_loss(matching_log_likelihood(velocity, target),
                                       matching_log_likelihood(old, target), weights,
                                       self.config.grpo.clip_range)
        return loss, stats["clip_fraction"]


TRAINERS = {"flow-grpo": FlowGRPO, "nft": ForwardProcessTrainer, "awm": AdvantageWeightedTrainer}


def build_trainer(config, policy, reward_fn, check_rewards) -> FlowGRPO:
    """The trainer ``config.objective.kind`` names."""
    return TRAINERS[config.objective.kind](config, policy, reward_fn, check_rewards)
