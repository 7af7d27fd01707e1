"""The trainers a run can optimise with (``objective.kind``), built by one function.

Both share the rollout, the rewards, the group advantages, the micro-batch loop, data-parallel
peers and the optimizer (:class:`~spotlight.rl.trainer.FlowGRPO`); the forward-process trainer
replaces only what one micro-batch's loss is and what it needs computed first.
"""
from __future__ import annotations

import numpy as np
import torch

from spotlight.models.device import module_device, to_device
from spotlight.rl.nft import noised, nft_loss, optimality, training_noise, training_sigmas
from spotlight.rl.trainer import ZERO_STATS, FlowGRPO, Rollout
from spotlight.rl.sampler import Trajectory


class ForwardProcessTrainer(FlowGRPO):
    """DiffusionNFT's objective (:mod:`spotlight.rl.nft`) on the rollout's clean samples.

    The sampling policy's velocity v_old at each (sample, noise level) is computed once, before
    the iteration's first optimizer step, from the weights the rollout was sampled with -- the
    ones this trainer holds when the train stage starts. ``approx_kl`` reports the mean squared
    drift of the velocity from v_old, and ``clip_fraction`` is 0: nothing is clipped."""

    def trained_steps(self, rollout: Rollout, iteration: int) -> list[int]:
        """Here: indices into the iteration's noise levels (every one is trained)."""
        return list(range(self.config.objective.nft_timesteps))

    def prepare(self, rollout: Rollout, kept: np.ndarray, steps: list[int], iteration: int) -> None:
        objective, traj = self.config.objective, rollout.trajectory
        self.sigmas = training_sigmas(self.config.seed, iteration, len(steps),
                                      objective.nft_sigma_min)
        shape = tuple(traj.final.shape[1:])
        self.noise = training_noise(self.config.seed, iteration, len(traj.final), len(steps), shape)
        self.old_velocity = torch.zeros_like(self.noise)
        rows = np.flatnonzero(kept)
        device = module_device(self.policy)
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

    @staticmethod
    def _sigma(sigma: float, device) -> torch.Tensor:
        return torch.tensor([sigma], dtype=torch.float32, device=device)

    def _backward(self, traj: Trajectory, idx: torch.Tensor, adv: torch.Tensor, texts: list[str],
                  steps: list[int], share: float) -> dict[str, float]:
        """Accumulate the gradient of ``share`` x the mean NFT loss over rows ``idx``."""
        objective, grpo = self.config.objective, self.config.grpo
        device = module_device(self.policy)
        x0 = to_device(traj.final[idx], device).float()
        optimal = to_device(torch.from_numpy(optimality(adv.cpu().numpy(), grpo.adv_clip_max))
                            .float(), device)
        text, ref_text = self.encode_prompts(texts)
        out = dict(ZERO_STATS)
        for j in steps:
            sigma = self.sigmas[j]
            x, target = noised(x0, to_device(self.noise[idx, j], device), sigma)
            old = to_device(self.old_velocity[idx, j], device)
            v = self.policy.velocity(x, self._sigma(sigma, device), text).float()
            loss = nft_loss(v, old, target, optimal, objective.nft_beta).mean() * share
            if self.reference is not None:
                with torch.no_grad():
                    ref = self.reference.velocity(x, self._sigma(sigma, device), ref_text).float()
                kl = ((v - ref) ** 2).mean() * share
                loss = loss + grpo.beta_kl * kl
                out["kl_to_reference"] += kl.item() / len(steps)
            (loss / len(steps)).backward(retain_graph=grpo.trainable == "all")
            out["loss"] += loss.item() / len(steps)
            out["approx_kl"] += float(((v.detach() - old) ** 2).mean()) * share / len(steps)
        return out


TRAINERS = {"flow-grpo": FlowGRPO, "nft": ForwardProcessTrainer}


def build_trainer(config, policy, reward_fn, check_rewards) -> FlowGRPO:
    """The trainer ``config.objective.kind`` names."""
    return TRAINERS[config.objective.kind](config, policy, reward_fn, check_rewards)
