"""A rollout whose requests run sequence-parallel (``parallel.size_classes`` gives their image
size a degree above 1): each request on an SP group of workers of one class.

The workers are persistent executors (:mod:`pipelines.parallel.executor`) holding the run's
policy in their worker context, grouped by the membership state machine
(:mod:`spotlight.parallel.membership`) per node and worker class into groups of the rollout's
degree (smaller ones take what a loss leaves). The groups stay formed from iteration to
iteration: a new weights version is read from the run store once per node and copied to the
node's other executors through shared memory, never to a communicator anew.

A request is the same fixed-shape request the single-worker rollout samples
(:func:`~pipelines.run.rollout.rollout_requests`); every member of its group runs the sampler,
the transformer computing its share of the sequence
(:func:`spotlight.parallel.ulysses.sequence_parallel`),
and the group's rank 0 commits every step to the run store. A member lost mid-request breaks
its group: the survivors regroup in under a second and the request resumes from its last
committed step on whichever group pulls it next -- the trajectory and log-probabilities equal
an uninterrupted run's.
"""
from __future__ import annotations

import contextlib
from functools import partial

from pipelines.cluster.classes import worker_classes
from pipelines.cluster.connect import Absence
from pipelines.parallel import executor
from pipelines.parallel.groups import SPGroups, node_of
from pipelines.parallel.serve import GroupServer
from pipelines.run import tasks
from pipelines.run.context import StageContext
from pipelines.run.rollout import RolloutChunk, RolloutDone
from pipelines.run.stages import RolloutResult
from pipelines.run.streamed import RolledOut, run_streamed_request
from spotlight.config import rollout_sp_degree
from spotlight.parallel import ulysses
from storage.attempts import FIRST, Attempt


def sp_rollout_request_task(epoch: int, config, store, chunk: RolloutChunk,
                            attempt: Attempt = FIRST) -> RolledOut | None:
    """One member's part of an SP rollout request; rank 0 returns the request's
    log-probabilities and record (the latents are in the run store)."""
    import torch.distributed as dist

    executor.check_epoch(epoch)
    member = executor.GroupMember(dist.get_rank())

    def sequence_parallel(policy):
        stack = contextlib.ExitStack()
        stack.enter_context(executor.breaks_on_error())
        stack.enter_context(ulysses.sequence_parallel(policy.transformer, dist.group.WORLD))
        return stack

    out = run_streamed_request(tasks.context(config, store), chunk.streamed.as_attempt(attempt),
                               lambda run: chunk.rolled_out(run, member), around=sequence_parallel)
    return out if member.leads else None


def degrees_below(degree: int) -> tuple[int, ...]:
    """The group sizes a rollout of ``degree`` is served by: itself, then the divisors below it
    (what a loss leaves still serves, slower)."""
    return tuple(d for d in range(degree, 0, -1) if degree % d == 0)


def sp_groups(ctx: StageContext, iteration: int) -> SPGroups:
    """The run's SP groups (formed on first use, then kept), holding weights ``iteration``."""
    config, client = ctx.config, ctx.cluster.client
    groups = ctx.carried.sp_groups
    if groups is None:
        classes = ctx.placed("rollout")
        known: dict[str, str] = {}

        def node(address: str) -> str:   # groups never mix worker classes
            cls = known.get(address) or worker_classes(client, classes).get(address, "?")
            return f"{cls}@{node_of(address)}"

        groups = SPGroups(client, {"run": (config, ctx.store)}, ctx.store.url, iteration,
                          degrees_below(rollout_sp_degree(config)), node=node)
        known.update(worker_classes(client, classes))
        groups.add(sorted(known))
        ctx.carried.sp_groups = groups
    elif groups.version != iteration:
        groups.published(iteration)
    return groups


class SPGroupsBackend:
    """The rollout's requests on the run's SP groups (spot or gpu workers of one class)."""

    def run(self, ctx: StageContext, chunks: list[RolloutChunk]) -> RolloutDone:
        config, store, client = ctx.config, ctx.store, ctx.cluster.client
        classes = ctx.placed("rollout")
        iteration = chunks[0].iteration
        losses_before = ctx.carried.sp_groups.losses if ctx.carried.sp_groups else 0
        groups = sp_groups(ctx, iteration)
        server = GroupServer(groups, {c.name: (sp_rollout_request_task, (config, store, c))
                                      for c in chunks},
                             members=lambda: sorted(worker_classes(client, classes)),
                             worker_class=classes[0], lease_epoch=store.epoch)
        gpu = Absence(ctx.cluster, config.placed("train")[0], config.cluster.worker_wait_s,
                      "the SP rollout")
        served = server.run(on_tick=partial(_check, ctx, gpu))
        summary = {"requests": len(chunks), "losses": groups.losses - losses_before,
                   "attempts": sum(served.attempts.values()),
                   "resumed_from": {r: s for r, s in served.resumed_from.items() if s},
                   "groups": [list(g.members) for g in groups.membership.serving()],
                   "membership": groups.log[-20:]}
        store.put_json(chunks[0].streamed.stage, "sp", summary)
        ctx.emit("sp_rollout", iteration=iteration,
                 **{k: summary[k] for k in ("requests", "losses", "attempts")})
        return RolloutDone([served.results[c.name].record for c in chunks],
                           RolloutResult(sp=summary),
                           files={c.name: served.results[c.name].log_probs for c in chunks})


def _check(ctx: StageContext, gpu: Absence, server: GroupServer) -> None:
    ctx.check_running()   # the run was stopped: stop waiting
    gpu.check()              # no gpu worker left for long: the run cannot go on
