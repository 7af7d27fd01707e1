"""Paired-seed harness runs for ``bench convergence``: every (mode, seed) one job, run in parallel
processes (one torch thread each, like a worker) and saved as it finishes, so a bench cut off
part-way continues with ``--resume`` from the jobs it has.

A job is one :class:`~pipelines.run.inprocess.InProcessRun` from the cached base model, validated
every ``every`` iterations on the fixed validation set, until it has reached the target and run
the fixed budget, or for at most ``iterations``. Its numbers are the cluster's (the harness
computes them bit for bit), so what differs between modes here is only what they learn per
iteration; time per iteration is measured on the cluster separately.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from pipelines.bench.bench_modes import objective_settings, planned_ratio, seed_mode, session_mode
from pipelines.cluster.connect import TaskFailedError
from pipelines.cluster.nanny import WORKER_MODULES
from pipelines.run.inprocess import InProcessRun
from spotlight.config import RunConfig, config_hash
from spotlight.evidence import crossing
from spotlight.iteration import TimeModel
from spotlight.staging import file_sha256

# What a saved job's mode names mean: 2 = 'spotlight' is stale exploration with the planner and
# 'stale' the fixed arm (in 1, 'spotlight' was the fixed arm and 'planned' the planner). Part of
# the fingerprint, so a part saved under other names is refused rather than misread.
MODE_NAMES = 2


@dataclass(frozen=True)
class PairedPlan:
    """What every job runs: the config (seed set per job), the iteration budget, the validation
    cadence, and where the stale-ranking probes go (stale jobs only)."""

    config: RunConfig
    iterations: int
    every: int
    base_val_reward: float
    lag_points: tuple[int, ...] = ()     # iterations at which τ against 1, 2, 4 versions is probed
    lags: tuple[int, ...] = (1, 2, 4)
    lag_prompts: int = 4
    lag_candidates: int = 16
    # A job stops at the first validation that has both reached ``target`` and run ``budget``
    # iterations (the fixed budget the area and the value at the budget are read at); without a
    # target every job runs all ``iterations``, which then only caps the unreached.
    target: float | None = None
    budget: int | None = None

    def fingerprint(self) -> str:
        """Jobs saved under another plan are not this bench's: resume refuses to mix them. Files
        the config names count by their contents, so a bench resumes from another checkout."""
        config = by_contents(self.config.with_values({"seed": 0}).to_dict())
        return config_hash(config, self.iterations,
                           self.every, self.base_val_reward, list(self.lag_points),
                           list(self.lags), self.lag_prompts, self.lag_candidates,
                           self.target, self.budget, MODE_NAMES)

    def settings(self) -> dict:
        """The plan as plain data, by dotted name (files by their contents): what each saved part
        keeps beside the fingerprint, so a bench resumed by a Spotlight that has added a setting
        since can tell its parts are still this plan's (:func:`changed_settings`)."""
        config = by_contents(self.config.with_values({"seed": 0}).to_dict())
        return _as_json({**flat(config), "bench.iterations": self.iterations,
                         "bench.every": self.every, "bench.base_val_reward": self.base_val_reward,
                         "bench.lag_points": list(self.lag_points), "bench.lags": list(self.lags),
                         "bench.lag_prompts": self.lag_prompts,
                         "bench.lag_candidates": self.lag_candidates,
                         "bench.target": self.target, "bench.budget": self.budget,
                         "bench.mode_names": MODE_NAMES})

    def done(self, run) -> bool:
        """Whether a harness run has what the bench reads from it (see ``target``)."""
        return (self.target is not None and len(run.iterations) >= (self.budget or 0)
                and crossing(run.val_curve(), self.target) is not None)


def by_contents(value):
    """``value`` (plain config data) with every string naming a file replaced by the sha256 of
    that file's bytes."""
    if isinstance(value, dict):
        return {k: by_contents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [by_contents(v) for v in value]
    if isinstance(value, str) and value and os.path.isfile(value):
        return "sha256:" + file_sha256(Path(value))
    return value


def flat(value: dict, prefix: str = "") -> dict:
    """A nested config dict by dotted names: {'grpo': {'lr': 1}} -> {'grpo.lr': 1}."""
    out = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        out.update(flat(item, name + ".") if isinstance(item, dict) else {name: item})
    return out


def _as_json(value):
    return json.loads(json.dumps(value, default=float))


def default_settings() -> dict:
    """Every setting's default, as :meth:`PairedPlan.settings` names them."""
    return _as_json(flat(by_contents(RunConfig().to_dict())))


def changed_settings(saved: dict, now: dict, defaults: dict) -> list[str]:
    """The settings in which a part saved under ``saved`` differs from a plan of ``now``. A
    setting the saved part does not name came after it: the part ran it at its default, so it
    counts as changed only if ``now`` sets another value."""
    missing = object()
    return [name for name in sorted(set(saved) | set(now))
            if saved.get(name, defaults.get(name, missing)) != now.get(name, missing)]


@dataclass(frozen=True)
class Job:
    mode: str
    seed: int
    # Planned modes: window s, s/sample-step and (where measured) a rollout's s.
    time_model: tuple[float, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.mode}-seed{self.seed}"


def cluster_part(mode: str, seed: int) -> str:
    """The saved name of ``mode``'s cluster run on ``seed`` (beside the harness jobs')."""
    return f"cluster-{mode}-seed{seed}"


def run_job(plan: PairedPlan, job: Job) -> dict:
    """One harness run (in a worker process): its validation curve, per-iteration rewards,
    group std, seed sources and audit τ, and for stale the τ-against-staleness probes."""
    started = time.perf_counter()
    config = plan.config.with_values({"seed": job.seed, **objective_settings(job.mode)})
    model = None
    ratio, mode = planned_ratio(job.mode), session_mode(job.mode)
    if ratio is not None:   # stale exploration with the planner, on the measured time
        window_s, sec_per_sample_step, *rollout_s = job.time_model
        config = config.with_values({"planner.enabled": True})
        model = TimeModel(window_s, sec_per_sample_step,
                          ratio * config.cluster.spot_workers * config.cluster.threads_per_worker,
                          rollout_s[0] if rollout_s else None)
    harness = InProcessRun(config, mode, base_val_reward=plan.base_val_reward, time_model=model)

    at_budget: list = []   # the validation rewards per prompt and seed at the budget

    def report(it) -> None:
        if it.iteration + 1 == (plan.budget or plan.iterations):
            at_budget.append(np.asarray(harness.last_val_rewards).tolist())
        if it.val_reward is not None:
            print(f"{job.mode:9s} seed {job.seed} iter {it.iteration:3d} val={it.val_reward:.3f} "
                  f"group_std={it.group_std:.3f}", flush=True)

    try:
        run = harness.run_iterations(plan.iterations, plan.every, report, plan.done)
        lag_taus = {}
        if seed_mode(job.mode) == "stale":   # the fixed arm's stale rankings, against older weights
            lag_taus = {str(k): {str(lag): tau for lag, tau in harness.staleness_taus(
                            k, list(plan.lags), plan.lag_prompts, plan.lag_candidates).items()}
                        for k in plan.lag_points if k <= len(run.iterations)}
    finally:
        harness.close()
    return {"mode": job.mode, "seed": job.seed, "base_val_reward": run.base_val_reward,
            "val_curve": run.val_curve(), "iterations": [asdict(it) for it in run.iterations],
            "lag_taus": lag_taus, "time_model": job.time_model,
            "budget_val_rewards": at_budget[0] if at_budget else None,
            "wall_s": time.perf_counter() - started}


@dataclass
class PairedStore:
    """The jobs' results as JSON files in one folder, written atomically (a cut-off write
    leaves no half file), each stamped with the plan's fingerprint."""

    folder: Path
    fingerprint: str
    settings: dict = field(default_factory=dict)
    loaded: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def open(cls, folder: Path, plan: PairedPlan, resume: bool) -> "PairedStore":
        folder.mkdir(parents=True, exist_ok=True)
        store = cls(folder, plan.fingerprint(), plan.settings())
        saved = sorted(folder.glob("*.json"))
        if saved and not resume:
            raise ValueError(f"{folder} holds {len(saved)} results of an earlier bench: pass "
                             "--resume to continue it, or move the folder away to start over")
        parts = {path: json.loads(path.read_text()) for path in saved}
        defaults = default_settings()
        for path, data in parts.items():
            if data.get("fingerprint") != store.fingerprint:
                # Parts saved before settings were kept name no setting: refused as before.
                changed = (changed_settings(data["settings"], store.settings, defaults)
                           if "settings" in data else None)
                if changed != []:
                    raise ValueError(refusal(path, saved_base(parts.values()), plan, changed))
            store.loaded[path.stem] = data["result"]
        return store

    def save(self, name: str, result: dict) -> None:
        path = self.folder / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "settings": self.settings,
                                   "result": result}, default=float))
        os.replace(tmp, path)
        self.loaded[name] = result


def saved_base(parts) -> float | None:
    """The base validation the saved harness parts started from (cluster parts keep none)."""
    return next((float(data["result"]["base_val_reward"]) for data in parts
                 if "base_val_reward" in (data.get("result") or {})), None)


def refusal(path: Path, base: float | None, plan: PairedPlan,
            changed: list[str] | None = None) -> str:
    """Why a saved part is not this bench's, and what to do. A base that validates otherwise is
    named apart: the same command on another machine pretrains another base (the float
    arithmetic of 8000 steps differs across CPUs), and its targets are not the saved ones."""
    if base is not None and abs(base - plan.base_val_reward) > 1e-12:
        return (f"{path} was measured from a base model that validates at {base:.4f}, "
                f"and this bench's base validates at {plan.base_val_reward:.4f}: the base was "
                "pretrained again (the parts' models/ folder was removed or not copied along). "
                "Restore that folder to resume, or run the seeds left as a new bench "
                "(--set seed=N, another --json) and pool them")
    which = (f" ({', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''})"
             if changed else "")
    return (f"{path} was measured with other settings{which} (config, iterations or "
            "validation) than this bench's, or saved by a Spotlight whose mode names differ: "
            "resume with the same command, or move the folder away to start over")


class BenchWorkerLost(TaskFailedError):
    """A bench's worker process died under a job (killed from outside: most often the kernel,
    out of memory); the jobs it finished before are saved."""


def run_jobs(plan: PairedPlan, jobs: list[Job], store: PairedStore, workers: int,
             on_done: Callable[[], None] = lambda: None,
             runner: Callable[[PairedPlan, Job], dict] = run_job) -> None:
    """Runs the jobs ``store`` lacks, ``workers`` at a time, in order (seed by seed, so a cut
    comes with whole comparisons); saves each as it finishes and calls ``on_done``."""
    queue = deque(job for job in jobs if job.name not in store.loaded)
    todo, started, slots = len(queue), time.monotonic(), max(1, workers)
    context = job_context()
    # A process of its own per job: a worker reused for forty OCR jobs had grown from 2.3 to
    # 8.8 GiB when the kernel killed it. One single-use pool each, since a pool's
    # max_tasks_per_child can deadlock on 3.11.
    running: dict = {}   # future -> (job, its pool)
    lost: tuple[Job, BaseException] | None = None   # no new job starts after a worker died
    try:
        while (queue and lost is None) or running:
            while queue and lost is None and len(running) < slots:
                job = queue.popleft()
                pool = ProcessPoolExecutor(1, mp_context=context)
                running[pool.submit(runner, plan, job)] = (job, pool)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job, pool = running.pop(future)
                pool.shutdown()
                try:
                    result = future.result()
                except BrokenProcessPool as err:
                    print(f"{job.name}: its worker process died; the jobs under way finish and "
                          "are saved, then the bench stops", flush=True)
                    lost = lost or (job, err)
                    continue
                store.save(job.name, result)
                done_jobs = saved_count(jobs, store)
                left = len(running) + len(queue)
                eta = time_left_s(time.monotonic() - started, todo - left, left)
                print(f"{job.name} done in {result['wall_s']:.0f} s "
                      f"({done_jobs}/{len(jobs)} jobs, about {eta / 60:.0f} min left)",
                      flush=True)
                on_done()
    finally:
        for _, pool in running.values():   # the jobs under way finish (as a pool's exit does)
            pool.shutdown()
    if lost is not None:
        raise worker_lost(lost[0], jobs, store) from lost[1]


def job_context() -> multiprocessing.context.BaseContext:
    """How a job's process starts: forked from one server process that imported the project
    once (torch, diffusers and the rest cost about 5 s of a core per process), as the embedded
    cluster's workers are. The server is a fresh interpreter that only imported modules, so no
    thread or torch state of the bench's process is forked; ``spawn`` where there is no fork
    server (Windows). The preload is fixed when the server starts: the workers' list, which an
    embedded cluster started later in this process shares."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*WORKER_MODULES, "pipelines.bench.paired"])
    return context


def saved_count(jobs: list[Job], store: PairedStore) -> int:
    return sum(job.name in store.loaded for job in jobs)


def worker_lost(job: Job, jobs: list[Job], store: PairedStore) -> BenchWorkerLost:
    done_jobs = saved_count(jobs, store)
    return BenchWorkerLost(
        f"the worker process running {job.name} died (killed from outside: most often the "
        f"kernel, out of memory; `dmesg` says). The {done_jobs} of {len(jobs)} jobs finished "
        f"are saved in {store.folder}: free memory or pass fewer --workers, then rerun the "
        "same command with --resume")


def time_left_s(elapsed_s: float, finished: int, remaining: int) -> float:
    """The rest at this sitting's pace: jobs run side by side, so the wall time per finished
    job already counts the parallelism (jobs differ in length: an estimate, not a promise)."""
    return elapsed_s / finished * remaining if finished else float("nan")
