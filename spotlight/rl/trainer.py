"""Flow-GRPO on a policy adapter: the PPO-clipped update of a rollout's groups by their
advantages, and the helpers every stage shares (the prompts and seeds of an iteration, the
micro-batches of an update). Rollouts, rewards and the order of an iteration's stages are the
iteration program's (:mod:`spotlight.iteration`) and its executors'.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from spotlight.config import RunConfig
from spotlight.models.device import module_device, to_device
from spotlight.models.prompts import Prompt
from spotlight.rl.grpo import Advantages, learning_rate, ppo_clipped_loss
from spotlight.rl.noise import SampleKey, derive_seed, prompt_id
from spotlight.rl.sampler import Trajectory, transition_distribution
from spotlight.rl.sde import gaussian_log_prob, kl_to_reference

# What one update reports, before it has computed anything (every trainer's keys).
ZERO_STATS = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "kl_to_reference": 0.0}


@dataclass
class Rollout:
    """A group rollout: P prompts x G seeds, flattened prompt-major."""

    prompts: list[Prompt]
    keys: list[SampleKey]
    trajectory: Trajectory
    images: np.ndarray          # (P*G, 3, H, W) in [0, 1]
    rewards: np.ndarray         # (P, G)


def iteration_prompts(prompts: list[Prompt], iteration: int, count: int,
                      run_seed: int) -> list[Prompt]:
    """The prompts of an iteration: epochs over a seeded shuffle of the training file."""
    chosen = []
    start = iteration * count
    for position in range(start, start + count):
        epoch, offset = divmod(position, len(prompts))
        order = np.random.default_rng(derive_seed(run_seed, epoch, 17)).permutation(len(prompts))
        chosen.append(prompts[order[offset]])
    return chosen


def random_seeds(run_seed: int, iteration: int, prompts: int, group: int) -> np.ndarray:
    """Fresh sample seeds (P, G) for an iteration that did not explore."""
    rng = np.random.default_rng(derive_seed(run_seed, iteration, 29))
    return rng.integers(0, 2**31 - 1, size=(prompts, group))


def sample_keys(run_seed: int, prompts: list[Prompt], seeds: np.ndarray) -> list[SampleKey]:
    return [SampleKey(run_seed, prompt_id(p.text), int(s))
            for p, row in zip(prompts, seeds) for s in row]


def rollout_chunks(prompts: int, per_request: int) -> list[slice]:
    """The prompt ranges a rollout is sampled in (``grpo.request_prompts`` each, the last one
    what is left). Every placement samples these same fixed-shape batches: batch shape moves
    floating-point results, so one split everywhere keeps a run's results placement-free."""
    return [slice(i, min(i + per_request, prompts)) for i in range(0, prompts, per_request)]



def micro_batches(rows: np.ndarray, epochs: int, size: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """The rows of each optimizer step of an iteration, in order: every epoch a new
    permutation of ``rows``, cut into micro-batches of ``size``."""
    batches = []
    for _ in range(epochs):
        order = rng.permutation(rows)
        batches += [order[start:start + size] for start in range(0, len(order), size)]
    return batches


def share_of(rows: int, rank: int, world: int) -> slice:
    """Member ``rank``'s contiguous share of ``rows`` split over ``world`` (sizes differ by at
    most one)."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


class DataParallelPeers(Protocol):
    """The processes that train one step together, each on its share of every micro-batch."""

    rank: int
    world: int
    # Sharded: the model's own collectives run in every forward and backward, so a peer
    # without rows in a micro-batch still computes one, weighted zero (else its peers wait).
    sharded: bool

    def all_reduce(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over the peers, in place."""


def mark_trainable(policy, trainable: str) -> list:
    """Freeze ``policy`` but for the parameters ``grpo.trainable`` names; returns those.

    Every process that holds a run's policy marks it so, whether it trains or not: torch picks
    other kernels for modules whose parameters require no gradient (a frozen prompt encoder),
    and a worker that only samples must compute exactly what the training worker does."""
    for p in policy.parameters():
        p.requires_grad_(False)
    params = policy.trainable_parameters(trainable)
    for p in params:
        p.requires_grad_(True)
    return params


class FlowGRPO:
    """Flow-GRPO trainer state: policy, frozen reference, optimizer and reward."""

    def __init__(self, config: RunConfig, policy, reward_fn, check_rewards) -> None:
        self.config, self.policy, self.reward_fn = config, policy, reward_fn
        self.check_rewards = check_rewards
        grpo = config.grpo
        self.parameters = mark_trainable(policy, grpo.trainable)
        self.reference = policy.reference() if grpo.beta_kl > 0 else None
        self.optimizer = self._new_optimizer()
        self.peers: DataParallelPeers | None = None   # set for a data-parallel step

    def rebind_parameters(self) -> None:
        """After the policy's modules were replaced by others holding the same weights (sharded
        ones): train theirs, with a fresh optimizer over them."""
        self.parameters = mark_trainable(self.policy, self.config.grpo.trainable)
        self.optimizer = self._new_optimizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        grpo = self.config.grpo
        return torch.optim.AdamW(self.parameters, lr=grpo.lr, weight_decay=grpo.weight_decay,
                                 betas=(0.9, 0.999), eps=1e-8)

    def load_optimizer_state(self, state: dict | None) -> None:
        """Restore the optimizer exactly as saved; ``None`` = a fresh one (weights version 0)."""
        self.optimizer = self._new_optimizer()
        if state is not None:
            self.optimizer.load_state_dict(state)

    def training_state(self) -> dict:
        """What a checkpoint keeps beside the weights everyone samples with, so this trainer
        resumes exactly: here the optimizer's state."""
        return self.optimizer.state_dict()

    def load_training_state(self, state: dict | None) -> None:
        """Restore what :meth:`training_state` saved (``None``: weights version 0)."""
        self.load_optimizer_state(state)

    # --- training ---------------------------------------------------------------------------
    def trained_steps(self, rollout: Rollout, iteration: int) -> list[int]:
        steps = rollout.trajectory.trainable_steps
        k = max(1, int(round(self.config.grpo.timestep_fraction * len(steps))))
        rng = np.random.default_rng(derive_seed(self.config.seed, iteration, 41))
        return sorted(rng.choice(steps, size=k, replace=False).tolist()) if steps else []

    def train(self, rollout: Rollout, advantages: Advantages, iteration: int) -> dict[str, float]:
        """PPO-clipped updates on the groups that carry signal, KL-regularised to the reference."""
        grpo = self.config.grpo
        adv = torch.from_numpy(advantages.values.reshape(-1)).float()
        kept = np.repeat(advantages.kept, advantages.values.shape[1])
        steps = self.trained_steps(rollout, iteration)
        totals = dict(ZERO_STATS)
        lr = learning_rate(grpo.lr, iteration, grpo.lr_decay_iterations, grpo.lr_min_fraction)
        if not kept.any() or not steps:
            return {**totals, "learning_rate": lr}
        traj, updates = rollout.trajectory, 0
        # Set every iteration (not stepped by a scheduler), so a resumed run gets the same rate.
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = micro_batches(np.flatnonzero(kept), grpo.inner_epochs, grpo.micro_batch,
                                np.random.default_rng(derive_seed(self.config.seed, iteration, 53)))
        self.prepare(rollout, batches, steps, iteration)
        self.policy.train()
        for batch in batches:
            idx = torch.from_numpy(batch)
            stats = self._update(traj, idx, adv[idx], [rollout.prompts[i].text for i in idx], steps)
            for key in totals:
                totals[key] += stats[key]
            updates += 1
        self.policy.eval()
        return {**{k: v / updates for k, v in totals.items()}, "learning_rate": lr}

    def prepare(self, rollout: Rollout, batches: list[np.ndarray], steps: list[int],
                iteration: int) -> None:
        """What an objective computes once per iteration, before its first optimizer step,
        knowing the micro-batches (rows) it will step on in order (Flow-GRPO: nothing -- the
        rollout recorded its old log-probabilities)."""

    def my_rows(self, batch: np.ndarray) -> np.ndarray:
        """The rows of micro-batch ``batch`` this process computes (all, without peers)."""
        rank, world = (0, 1) if self.peers is None else (self.peers.rank, self.peers.world)
        return batch[share_of(len(batch), rank, world)]

    def _update(self, traj: Trajectory, idx: torch.Tensor, adv: torch.Tensor, texts: list[str],
                steps: list[int]) -> dict[str, float]:
        """One optimizer step on micro-batch ``idx``. With data-parallel ``peers`` this process
        computes its contiguous share of the micro-batch, weighted by its size, and the
        gradients (and the statistics) are summed over the peers before the step: every peer
        takes the single-process step."""
        self.optimizer.zero_grad(set_to_none=True)
        rank, world = (0, 1) if self.peers is None else (self.peers.rank, self.peers.world)
        mine = share_of(len(idx), rank, world)   # as my_rows takes them
        out = dict(ZERO_STATS)
        if mine.stop > mine.start:
            out = self._backward(traj, idx[mine], adv[mine], texts[mine], steps,
                                 (mine.stop - mine.start) / len(idx))
        elif self.peers is not None and self.peers.sharded:
            self._backward(traj, idx[:1], adv[:1], texts[:1], steps, 0.0)   # see the Protocol
        if self.peers is not None:
            out = self._sum_over_peers(out)
        torch.nn.utils.clip_grad_norm_(self.parameters, self.config.grpo.max_grad_norm)
        self.optimizer.step()
        return out

    def _backward(self, traj: Trajectory, idx: torch.Tensor, adv: torch.Tensor, texts: list[str],
                  steps: list[int], share: float) -> dict[str, float]:
        """Accumulate the gradient of ``share`` x the mean loss over rows ``idx``, on the
        policy's device (a trajectory read back from the store is on the host)."""
        grpo, sampler = self.config.grpo, self.config.sampler
        device = module_device(self.policy)
        latents, old_log_probs = (to_device(traj.latents[idx], device),
                                  to_device(traj.log_probs[idx], device))
        adv = to_device(adv, device)
        text, ref_text = self.encode_prompts(texts)
        out = dict(ZERO_STATS)
        for t in steps:
            dist = transition_distribution(self.policy, latents, t, traj.sigmas, text, sampler)
            log_prob = gaussian_log_prob(latents[:, t + 1], dist)
            loss, stats = ppo_clipped_loss(log_prob, old_log_probs[:, t], adv, grpo.clip_range)
            loss = loss.mean() * share
            if self.reference is not None:
                with torch.no_grad():
                    ref = transition_distribution(self.reference, latents, t, traj.sigmas,
                                                  ref_text, sampler)
                kl = kl_to_reference(dist, ref.mean).mean() * share
                loss = loss + grpo.beta_kl * kl
                out["kl_to_reference"] += kl.item() / len(steps)
            (loss / len(steps)).backward(retain_graph=grpo.trainable == "all")
            out["loss"] += loss.item() / len(steps)
            out["clip_fraction"] += stats["clip_fraction"] * share / len(steps)
            out["approx_kl"] += stats["approx_kl"] * share / len(steps)
        return out

    def encode_prompts(self, texts: list[str]):
        """The prompts' embeddings under the policy (with grad when the encoder trains) and
        under the frozen reference (None without one)."""
        with torch.set_grad_enabled(self.config.grpo.trainable == "all"):
            text = self.policy.encode(texts)
        if self.reference is None:
            return text, None
        with torch.no_grad():
            return text, self.reference.encode(texts)

    def _sum_over_peers(self, out: dict[str, float]) -> dict[str, float]:
        for p in self.parameters:   # a peer with no rows (or no path to p) adds zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        totals = torch.tensor([out[k] for k in out], dtype=torch.float64)
        self.peers.all_reduce([p.grad for p in self.parameters] + [totals])
        return dict(zip(out, totals.tolist()))
