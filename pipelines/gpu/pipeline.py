"""The pipeline part: the tiny Qwen-Image pipeline end to end on the check's device -- an
embedded cluster (one gpu worker, one spot worker), a file run store, Spotlight's default mode
-- for two iterations, then one exploration request SIGKILLed on its spot worker after a
committed step and resumed on a fresh one, compared with the same request run clean.

Each worker builds its policy on ``model.device`` and keeps it there; the part asks every worker
where its policy is and how much GPU memory it took (``workers_device``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from pipelines.cluster.classes import scheduler_workers
from pipelines.cluster.dispatch import RequestPool, RequestSpec
from pipelines.cluster.injector import SpotFleet
from pipelines.cluster.runtime import runtime
from pipelines.front.session import Session
from pipelines.gpu.record import Record
from pipelines.run.records import explore_request, stage_name
from pipelines.run.tasks import ExploreRequest, explore_task
from spotlight.config import PROJECT_ROOT, RunConfig, load_config
from spotlight.models.device import module_device
from spotlight.sizing import GIB

REQUEST = explore_request(0, 0)
KILL_STEPS = {"cpu": 100, "cuda": 1000}   # a replay long enough to be killed half-way
WAIT_S = 300.0


def pipeline_config(device: str) -> RunConfig:
    """The tiny Qwen-Image config on ``device``. Its images are noise (random weights), so the
    digit recogniser behind the reward is trained for one epoch, not 30: seconds, not minutes,
    on a bare machine with no cache."""
    return load_config(PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml",
                       {"model.device": device, "cluster.gpu_workers": 1,
                        "cluster.spot_workers": 1, "cluster.dashboard": False,
                        "reward.recognizer_epochs": 1})


def run_pipeline(record: Record, device: str, folder: Path) -> None:
    """Two iterations, then the killed-and-resumed request; each figure written at once."""
    config = pipeline_config(device)
    start = time.time()
    with Session.from_config(config, store=str(folder / "run")) as session:
        record.update("pipeline.session_start_seconds", time.time() - start)
        seconds = []
        for _ in range(2):
            begun = time.time()
            session.run(1)
            seconds.append(time.time() - begun)
            history = session.history
            record.update("pipeline.iterations", {
                "completed": len(history), "seconds": seconds,
                "reward_mean": [float(v) for v in history["reward_mean"]],
                "workers_device": workers_device(session)})
        kill_steps = KILL_STEPS.get(torch.device(device).type, KILL_STEPS["cpu"])
        record.update("pipeline.preempt_resume", preempt_and_resume(session, kill_steps))


def _placement(dask_worker=None) -> dict:
    """On a worker (``client.run``): where its run's policies are, and its GPU's peak memory."""
    contexts = runtime(dask_worker).slot("run-contexts", dict)
    out: dict[str, Any] = {"policy_devices": sorted({str(module_device(c.policy))
                                                     for c in contexts.values()})}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out


def workers_device(session: Session) -> dict:
    """Per worker name: its policies' devices (and GPU peak memory)."""
    client = session.cluster.client
    names = {addr: info.get("name", addr)
             for addr, info in scheduler_workers(client).items()}
    return {str(names.get(addr, addr)): placed
            for addr, placed in client.run(_placement).items()}


def explore_spec(session: Session, stage: str, seeds: np.ndarray, steps: int) -> RequestSpec:
    request = ExploreRequest(0, 0, session.train_prompts[0], seeds, 0, 0, stage, steps=steps)
    return RequestSpec("r", explore_task, (session.config, session.store, request),
                       stage_name(0, stage), REQUEST)


def committed_step(session: Session, stage: str) -> int:
    record = session.store.latents.commit_record(stage_name(0, stage), REQUEST)
    return -1 if record is None else int(record["step"])


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(f"check-gpu: timed out after {timeout:.0f} s waiting for {what}")


def preempt_and_resume(session: Session, steps: int) -> dict:
    """The request run clean, then again with its spot worker SIGKILLed once a step is
    committed and a fresh spot worker started: where it resumed and how far it is from clean."""
    seeds = np.arange(3)
    config, store = session.config, session.store
    start = time.time()
    clean = RequestPool(session.cluster, [explore_spec(session, "check-clean", seeds, steps)],
                        config.preemption, store=store)
    clean.wait(WAIT_S)
    reference = clean.close()["r"]
    clean_s = time.time() - start
    fleet = SpotFleet(session.cluster, config.cluster)
    start = time.time()
    pool = RequestPool(session.cluster, [explore_spec(session, "check-killed", seeds, steps)],
                       config.preemption, store=store)
    wait_until(lambda: committed_step(session, "check-killed") > 0, WAIT_S, "a committed step")
    killed_at = committed_step(session, "check-killed")
    preempted = not pool.done and fleet.preempt(fleet.names()[0], "kill")
    if preempted:
        fleet.add(1)
    pool.wait(WAIT_S)
    out = pool.close()["r"]
    stage = stage_name(0, "check-killed")
    resumed = store.latents.commit_record(stage, REQUEST)["resumes"]
    ours = np.asarray(store.read_trajectory(stage, REQUEST))
    theirs = np.asarray(store.read_trajectory(stage_name(0, "check-clean"), REQUEST))
    return {"preempted": bool(preempted and pool.summary()["preemptions_hard"] >= 1),
            "steps": steps, "killed_after_step": killed_at,
            "resumed_from": resumed[0] if resumed else None,
            "equal": bool(np.array_equal(ours, theirs)
                          and np.array_equal(out.rewards, reference.rewards)),
            "max_abs_diff": float(np.abs(ours - theirs).max()),
            "rewards_max_abs_diff": float(np.abs(out.rewards - reference.rewards).max()),
            "clean_seconds": clean_s, "killed_seconds": time.time() - start}
