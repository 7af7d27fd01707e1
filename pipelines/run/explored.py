"""Training on the explored samples themselves (``objective.train_on_explored``).

Exploration already drew every candidate's image and scored it; a forward-process objective
(``objective.kind: nft``) needs only clean samples and their rewards -- no log-probabilities
under the weights being trained -- so the seeds an iteration selected need not be rolled out
again. Each exploration request keeps its candidates' final latents in the run store
(:func:`pipelines.run.tasks.explore_task`); :func:`explored_rollout_task` gathers the selected
ones into the iteration's rollout, in the rollout stage's own layout (one request,
``explored``), and the exploration rewards into its reward stage, so the train stage, a
resumed run and the audit trail read them as they read a rollout.

The samples were drawn by the weights that explored them (θ_k-1 for stale exploration) at the
exploration's steps; the forward-process loss is indifferent to who sampled (its v_old is the
weights being trained). A selection with a seed nobody explored (a prompt filled with random
seeds) is rolled out as usual.
"""
from __future__ import annotations

import time

import numpy as np

from pipelines.run import rollout_store, tasks
from pipelines.run.records import EXPLORED_SAMPLES, stage_name, task_record
from spotlight.config import RunConfig
from spotlight.exploration import Selection
from storage import RunStore
from storage.attempts import FIRST

REQUEST = "explored"   # the explored rollout's one request in the rollout stage


def explored_finals(store: RunStore, stage: str) -> dict[tuple[int, int], np.ndarray]:
    """(prompt index, seed) -> final latent of every explored candidate kept in ``stage``."""
    finals = {}
    for name in store.array_names(stage, EXPLORED_SAMPLES):
        arrays = store.get_arrays(stage, name)
        prompt = int(arrays["prompt_index"])
        for seed, final in zip(arrays["seeds"].tolist(), arrays["final"]):
            finals[(prompt, int(seed))] = final
    return finals


def explored_rollout_task(config: RunConfig, store: RunStore, request: tasks.RolloutRequest,
                          selection: Selection, explored_in: str) -> dict:
    """The selected seeds' explored samples as ``request``'s rollout, and their exploration
    rewards as its rewards, written to the rollout and reward stages. ``found`` is False
    (nothing written) when a selected seed has no kept sample: roll the iteration out."""
    start = time.time()
    k = request.iteration
    finals = explored_finals(store, stage_name(k, explored_in))
    keys = [(p, int(seed)) for p, row in enumerate(np.asarray(request.seeds)) for seed in row]
    missing = [key for key in keys if key not in finals]
    if missing:
        return {"found": False, "missing": len(missing)}
    latents = np.stack([finals[key] for key in keys])[:, None]   # (B, 1, ...): the final only
    log_probs = np.zeros((len(keys), 0), np.float32)   # a forward-process objective needs none
    stage = stage_name(k, "rollout")
    name = rollout_store.save_request(store, stage, REQUEST, FIRST, log_probs, latents)
    rollout_store.write_index(store, stage, [REQUEST], [name], request.seeds)
    rewards = np.asarray(selection.selected_rewards, dtype=np.float64)
    store.put_arrays(stage_name(k, "reward"), "reward", {"rewards": rewards})
    ctx = tasks.context(config, store)
    with ctx.lock:
        record = task_record("rollout", k, start, request.version,
                             explored=explored_in, samples=len(keys))
        # Held for the train task on this worker, as a resumed run reads it back from the store.
        trajectory = ctx.trajectory_of(log_probs, latents)
        ctx.rollouts = {k: tasks.RolloutOutput(k, trajectory, record)}
    return {"found": True, "rewards": rewards, "record": record}
