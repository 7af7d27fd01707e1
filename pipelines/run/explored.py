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
weights being trained). A prompt with a seed nobody explored (one the plan left out, filled with
random seeds) is rolled out as usual, and only those prompts: their samples are joined with the
explored ones, and the iteration trains on both (partial reuse).
"""
from __future__ import annotations

import time

import numpy as np

from pipelines.run import rollout_store, tasks
from pipelines.run.records import EXPLORED_SAMPLES, stage_name, task_record
from pipelines.run.rollout_store import read_rollout
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
                          selection: Selection, explored_in: str,
                          rows: tuple[int, ...] | None = None,
                          part_start: float | None = None) -> dict:
    """The selected seeds' explored samples of the prompts ``rows`` (None: all) as ``request``'s
    rollout, written to the rollout stage; ``found`` is False (nothing written) when one of
    them has no kept sample: roll the iteration out.

    Every prompt explored: their exploration rewards are written as the reward stage's. Some:
    the other prompts' rollout, stored just before as a part (``RolloutRequest.part``), is
    joined in, prompt by prompt, and the reward stage scores the whole (``rolled_out`` in the
    record: how many samples were sampled for it; the record starts at ``part_start``, when
    that rollout began)."""
    start = time.time()
    k = request.iteration
    seeds = np.asarray(request.seeds)
    rows = tuple(range(len(seeds))) if rows is None else tuple(rows)
    finals = explored_finals(store, stage_name(k, explored_in))
    keys = [(p, int(seed)) for p in rows for seed in seeds[p]]
    missing = [key for key in keys if key not in finals]
    if missing:
        return {"found": False, "missing": len(missing)}
    stage = stage_name(k, "rollout")
    others = [p for p in range(len(seeds)) if p not in rows]
    by_prompt = {p: np.stack([finals[(p, int(seed))] for seed in seeds[p]]) for p in rows}
    if others:   # the part: the other prompts, in their order, each with its group
        _, part = read_rollout(store, stage)
        group = seeds.shape[1]
        by_prompt.update({p: part[i * group:(i + 1) * group, -1] for i, p in enumerate(others)})
    latents = np.concatenate([by_prompt[p] for p in range(len(seeds))])[:, None]   # finals
    log_probs = np.zeros((len(latents), 0), np.float32)   # a forward-process objective needs none
    name = rollout_store.save_request(store, stage, REQUEST, FIRST, log_probs, latents)
    rollout_store.write_index(store, stage, [REQUEST], [name], seeds)
    rewards = None
    if not others:
        rewards = np.asarray(selection.selected_rewards, dtype=np.float64)
        store.put_arrays(stage_name(k, "reward"), "reward", {"rewards": rewards})
    ctx = tasks.context(config, store)
    with ctx.lock:
        began = part_start if others and part_start is not None else start
        record = task_record("rollout", k, began, request.version, explored=explored_in,
                             samples=int(seeds.size),
                             **({"rolled_out": len(others) * seeds.shape[1]} if others else {}))
        # Held for the train task on this worker, as a resumed run reads it back from the store.
        trajectory = ctx.trajectory_of(log_probs, latents)
        ctx.rollouts = {k: tasks.RolloutOutput(k, trajectory, record)}
    return {"found": True, "rewards": rewards, "record": record}
