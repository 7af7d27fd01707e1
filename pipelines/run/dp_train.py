"""Training as one data-parallel step over every gpu worker (``parallel.data_parallel``).

Each gpu worker reads the iteration's rollout from the run store and runs the trainer on its
share of every micro-batch; the gradients are summed over the group
(:mod:`pipelines.parallel.training`), so all of them take the step a single worker would and
hold the new weights afterwards. Rank 0's weights and optimizer state become the checkpoint. A
gpu worker lost mid-step: the group is formed anew over the ones left and the step runs again
from the stored version.
"""
from __future__ import annotations

from pipelines.cluster import worker_classes
from pipelines.parallel import training
from pipelines.run import tasks
from pipelines.run.context import StageContext


def dp_train_task(epoch: int, config, store, request: tasks.TrainRequest) -> dict:
    """One member's part of the data-parallel step."""
    ctx = tasks.context(config, store)
    with ctx.lock:
        rollout = ctx.rollout(request.iteration)
    return tasks.train_task(config, store, rollout, request, peers=training.peers(epoch))


def gpu_workers(ctx: StageContext) -> list[str]:
    return sorted(worker_classes(ctx.cluster.client, (ctx.config.placed("train")[0],)))


def data_parallel(ctx: StageContext) -> bool:
    """Whether this iteration trains data-parallel: asked for, and more than one gpu worker."""
    return ctx.config.parallel.data_parallel and len(gpu_workers(ctx)) > 1


def dp_train(ctx: StageContext, request: tasks.TrainRequest) -> dict:
    """The step on every gpu worker at once; rank 0's result (what :func:`tasks.train_task`
    returns)."""
    return on_training_group(ctx, dp_train_task, request)


def on_training_group(ctx: StageContext, task, request: tasks.TrainRequest) -> dict:
    """``task(epoch, config, store, request)`` on every gpu worker at once, over the run's
    training group (formed on first use, and anew when the gpu workers change); rank 0's
    result."""
    carried = ctx.carried
    if carried.training_group is None:
        carried.training_group = training.TrainingGroup(ctx.cluster.client,
                                                        ctx.config.model.device)
    ctx.check_running()
    return carried.training_group.run(lambda: gpu_workers(ctx), task, ctx.config, ctx.store,
                                      request)
