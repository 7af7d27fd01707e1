"""What each member of a test data-parallel training group runs (spawned, gloo on loopback)."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

ROWS = 7   # not a multiple of the group's size: unequal shares


def trainer_and_batch(objective: str = "flow-grpo"):
    """A tiny digits trainer of ``objective`` with a sampled trajectory and advantages (the
    same in every process: fixed seeds), prepared for its iteration as ``train`` does."""
    from spotlight.config import RunConfig
    from spotlight.models.base import build_policy
    from spotlight.models.prompts import Prompt
    from spotlight.rl.noise import SampleKey
    from spotlight.rl.objectives import build_trainer
    from spotlight.rl.sampler import sample
    from spotlight.rl.trainer import Rollout

    torch.manual_seed(0)
    config = RunConfig().with_values({
        "model.num_layers": 1, "model.text_dim": 16, "model.text_layers": 1,
        "model.attention_head_dim": 16, "sampler.num_steps": 3, "grpo.beta_kl": 0.01,
        "objective.kind": objective})
    policy = build_policy(config)
    trainer = build_trainer(config, policy, lambda images, prompts: np.zeros(len(prompts)),
                            lambda rewards, where: None)
    texts = [f"{i}{i + 1}{i + 2}" for i in range(ROWS)]
    with torch.no_grad():
        traj = sample(policy, texts, [SampleKey(0, i, i) for i in range(ROWS)], config.sampler,
                      mode="sde")
    adv = torch.linspace(-0.5, 1.0, ROWS)   # a mean away from 0: a loss to compare
    rollout = Rollout([Prompt(t, "ocr") for t in texts], [], traj, np.empty(0), np.zeros(0))
    steps = trainer.trained_steps(rollout, 0)
    trainer.prepare(rollout, [np.arange(ROWS)], steps, 0)   # one micro-batch of every row
    return trainer, traj, adv, texts, steps


def member(rank: int, world: int, port: int, out_dir: str,
           objectives: tuple[str, ...] = ("flow-grpo",)) -> None:
    """Each objective's step alone and as this rank's share summed over one gloo group (the
    group is formed once: a process spawned per objective would pay its imports again)."""
    from pipelines.parallel.training import GroupPeers

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=timedelta(seconds=60))
    peers = GroupPeers(dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, world,
                                            timedelta(seconds=60)), rank, world)
    for objective in objectives:
        torch.save(_summed_step(objective, peers, rank, world),
                   f"{out_dir}/rank{rank}-{objective}.pt")


def _summed_step(objective: str, peers, rank: int, world: int) -> dict:
    from spotlight.rl.trainer import share_of

    trainer, traj, adv, texts, steps = trainer_and_batch(objective)
    idx = torch.arange(ROWS)
    trainer.optimizer.zero_grad(set_to_none=True)
    alone = trainer._backward(traj, idx, adv, texts, steps, 1.0)
    expected = {n: p.grad.clone() for n, p in trainer.policy.named_parameters()
                if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.peers = peers
    mine = share_of(ROWS, rank, world)
    part = trainer._backward(traj, idx[mine], adv[mine], texts[mine], steps,
                             (mine.stop - mine.start) / ROWS)
    summed = trainer._sum_over_peers(part)
    grads = {n: p.grad for n, p in trainer.policy.named_parameters() if n in expected}
    return {"grad_diff": max(float((grads[n] - expected[n]).abs().max()) for n in expected),
            "grad_scale": max(float(g.abs().max()) for g in expected.values()),
            "params": len(expected), "stats": summed, "alone": alone}
