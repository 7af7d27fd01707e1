"""The Dask iteration graph on real worker processes: placement, versions, resume, bad clusters."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from pipelines.cluster import ClusterError
from pipelines.front.audit import audit_table
from pipelines.front.session import Session
from spotlight.config import ConfigError, load_config
from spotlight.exploration.fidelity import grouped_kendall_tau
from storage import RunStore
from tests.ports import free_port

pytestmark = pytest.mark.timeout(600)


def task_records(store: RunStore, iterations: int) -> list[dict]:
    out = []
    for k in range(iterations):
        out += store.get_json(f"iter-{k}/iteration", "tasks")["tasks"]
    return out


def test_spotlight_mode_places_tasks_and_explores_with_stale_weights(tiny_run_config, tmp_path):
    with Session.from_config(tiny_run_config, store=str(tmp_path / "run")) as session:
        assert session.mode == "spotlight"
        reads = session.store.manifest.reads
        history = session.run(2)
        # the driver writes the manifest alone and keeps its copy: no GET per stage check
        assert (session.store.manifest.reads - reads) / 2 <= 3
        store = session.store
        records = task_records(store, 2)
        assert list(history.index) == [0, 1]
        assert history["cost_total_usd"].iloc[-1] > history["cost_usd"].iloc[0] > 0
    stages = {r["stage"] for r in records}
    assert {"rollout", "reward", "advantages", "train", "checkpoint", "validation",
            "explore"} <= stages
    for r in records:
        expected = "spot-" if r["stage"] in ("explore", "audit") else "gpu-"
        assert r["worker"].startswith(expected), r
        assert r["end"] >= r["start"]
    explores = [r for r in records if r["stage"] == "explore"]
    # Exploration ran only for iteration 1 (the last iteration has no next), with θ_0.
    assert explores and {(r["iteration"], r["weights_version"]) for r in explores} == {(1, 0)}
    rollouts = {r["iteration"]: r["weights_version"] for r in records if r["stage"] == "rollout"}
    assert rollouts == {0: 0, 1: 1}
    # Iteration 1 rolled out the explored seeds with the most spread.
    selection = store.stage_record("iter-1/selection")["info"]
    assert selection["source"] == "explore"
    candidates = store.get_json("iter-1/explore", "candidates")
    chosen = store.get_json("iter-1/selection", "selection")   # kept out of the manifest
    assert "selection" not in selection
    # Planner and monitor state, rewritten every iteration, lives beside the record too.
    assert "planner" not in store.stage_record("iter-1/iteration")["info"]
    assert "arms" in store.get_json("iter-1/iteration", "planning")["planner"]
    for row, seeds in zip(chosen["seeds"], candidates["seeds"]):
        assert set(row) <= set(seeds) and len(seeds) == tiny_run_config.exploration.candidates
    # Plain xarray opens the finished run's stores, labelled, without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = xr.open_zarr(store.url + "/rewards.zarr")
        batch = xr.open_zarr(store.url + "/iter-000001/rollout.zarr/latents/p0000")
        explored = xr.open_zarr(store.url + "/iter-000001/explore.zarr/latents/p0000-c0000")
    assert set(np.unique(table["stage"].values[~table["stage"].isnull().values])) >= {
        "rollout", "explore"}
    steps = tiny_run_config.sampler.num_steps
    assert batch["latent"].dims == ("step", "sample", "token", "channel")
    assert batch.sizes["step"] == steps + 1 and int(batch["weights_version"]) == 1
    assert list(batch["seed"].values) == [s for row in chosen["seeds"] for s in row]
    assert batch["sigma"].values[0] == 1.0 and batch["sigma"].values[-1] == 0.0
    assert list(explored["seed"].values) == candidates["seeds"][0][:explored.sizes["sample"]]
    assert int(explored["weights_version"]) == 0 and len(set(explored["prompt"].values)) == 1
    # exploration.window "iteration" (the default): iteration 1 was planned (and its exploration
    # started) before iteration 0's rollout was recorded -- the spot worker is not idle during it.
    assert (store.stage_record("iter-1/plan")["info"]["planned_at"]
            < store.stage_record("iter-0/rollout")["info"]["task"]["start"])


def test_planner_and_rank_fidelity_are_wired_into_every_iteration(tiny_run_yaml, tmp_path):
    """Plans are recorded; τ is measured wherever stale rewards meet a rollout; a low τ sends the
    next iteration to fresh (sync) exploration on gpu workers, and audits run on spot."""
    # The planner's budget logic is tested on a simulated clock (tests/exploration); a tiny
    # model trains in milliseconds, so here N is fixed and every iteration explores.
    overrides = {"planner.enabled": False, "fidelity.floor": 1.0, "fidelity.recover_margin": 0.0,
                 "fidelity.window": 1, "fidelity.min_iterations": 1, "fidelity.audit_every": 2,
                 "fidelity.audit_candidates": 4, "exploration.window": "train"}
    with Session.from_config(tiny_run_yaml, store=str(tmp_path / "run"),
                             overrides=overrides) as session:
        history = session.run(4)
        store = session.store
        records = task_records(store, 4)
    for k in range(1, 4):
        plan = store.stage_record(f"iter-{k}/plan")["info"]["plan"]
        assert (plan["candidates"], plan["prompts"]) == (6, 2) and "fixed" in plan["reason"]
        # window "train": the next iteration is explored only once this one's rewards are in
        assert (store.stage_record(f"iter-{k}/plan")["info"]["planned_at"]
                > store.stage_record(f"iter-{k - 1}/reward")["info"]["task"]["end"])
    taus = history["kendall_tau"]
    assert taus.iloc[0] is None or np.isnan(taus.iloc[0])   # iteration 0 had no exploration
    for k in range(3):
        source = store.stage_record(f"iter-{k + 1}/selection")["info"]["source"]
        # floor 1.0: every tau below 1 falls back for the next iteration, and only then.
        fell_back = history["fidelity_state"].iloc[k] == "fallback"
        assert (source == "explore-sync") == fell_back, (k, source, history.iloc[k].to_dict())
        if source == "explore-sync":
            assert any(r["stage"] == "explore-sync" and r["iteration"] == k + 1 and
                       r["worker"].startswith("gpu-") for r in records)
    for k in range(1, 4):   # τ from the stored rewards, as an independent oracle
        if store.stage_record(f"iter-{k}/explore") is None:   # the plan skipped exploring
            assert taus.iloc[k] is None or np.isnan(taus.iloc[k])
            continue
        stale = store.get_json(f"iter-{k}/explore", "candidates")
        seeds = store.get_json(f"iter-{k}/selection", "selection")["seeds"]
        rollout = store.get_arrays(f"iter-{k}/reward", "reward")["rewards"]
        xs, ys = [], []
        for p, row in enumerate(seeds):
            scored = dict(zip(stale["seeds"][p], stale["rewards"][p]))
            xs.append([scored[s] for s in row if s in scored])
            ys.append([rollout[p, g] for g, s in enumerate(row) if s in scored])
        expected = grouped_kendall_tau(xs, ys)
        got = taus.iloc[k]
        if np.isnan(expected):   # constant rewards (a tiny model): τ undefined, not invented
            assert got is None or np.isnan(got)
        else:
            assert got == pytest.approx(expected)
    audits = [r for r in records if r["stage"] == "audit"]
    assert audits and all(r["worker"].startswith("spot-") and r["weights_version"] == r["iteration"]
                          for r in audits)
    table = xr.open_zarr(store.url + "/rewards.zarr")
    measured = taus.dropna()
    assert "kendall_tau" in table
    assert np.isfinite(table["kendall_tau"].values).any() == (len(measured) > 0 or
                                                             history["audit_tau"].notna().any())


def _spotlight_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c",
            "import sys; from spotlight import main; sys.exit(main(sys.argv[1:]))", *args]


def _wait_for_stage(store_path, stage: str, proc: subprocess.Popen, limit_s: float = 300) -> None:
    manifest = store_path / "manifest.json"
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run exited early with {proc.returncode}: {proc.stdout.read()}")
        if manifest.exists() and f'"{stage}"' in manifest.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"stage {stage} never appeared")


# One kill point: a crash right after each kind of stage record is covered in process by
# test_stage_resume.py; this one is a real SIGKILL of the driver with weights committed.
@pytest.mark.parametrize("kill_after", ["iter-000000/train"])
def test_driver_sigkill_then_resume_equals_uninterrupted(tiny_run_yaml, tmp_path, kill_after):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    config = load_config(tiny_run_yaml, {"iterations": 2})
    with Session.from_config(config, store=str(clean)) as session:
        session.run(2)

    # A lease of 15 s is still live when the takeover below starts (it is at least 10 s away
    # from expiry at the kill: renewed every third of its TTL).
    proc = subprocess.Popen(_spotlight_cmd("run", "--config", str(tiny_run_yaml), "--iterations",
                                           "2", "--store", str(killed), "--lease-ttl", "15"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _wait_for_stage(killed, kill_after, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the driver and every worker process it started
        proc.wait()
    # The killed driver's lease is still live: a plain resume is refused at once, naming it;
    # the user takes over at once, and the takeover waits out the unrenewed lease.
    refused = subprocess.run([sys.executable, "-c", "import sys; from spotlight import main; "
                              "code = main(sys.argv[1:]); print('torch loaded:', 'torch' in "
                              "sys.modules); sys.exit(code)", "run", "--resume", str(killed)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"(pid {proc.pid}," in refused.stderr and "--takeover" in refused.stderr
    assert "run:" not in refused.stdout   # it stopped before starting a cluster
    assert "torch loaded: False" in refused.stdout   # ... or loading the model code
    done = subprocess.run(_spotlight_cmd("run", "--resume", str(killed), "--takeover"),
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lease: held by the driver on host {socket.gethostname()} (pid {proc.pid}" \
        in done.stderr and "waiting up to" in done.stderr, done.stderr
    assert "lease: epoch 2" in done.stdout + done.stderr
    assert "resuming" in done.stdout and "within its first iteration" in done.stdout

    a, b = RunStore.open(str(clean), create=False), RunStore.open(str(killed), create=False)
    assert a.latest_checkpoint() == b.latest_checkpoint() == 2
    wa, wb = a.load_checkpoint(2), b.load_checkpoint(2)
    assert wa.weights and sorted(wa.weights) == sorted(wb.weights)
    for name, tensor in wa.weights.items():
        assert torch.equal(tensor, wb.weights[name]), name
    ra, rb = a.open_rewards(), b.open_rewards()
    np.testing.assert_array_equal(ra["reward"].values, rb["reward"].values)
    np.testing.assert_array_equal(ra["seed"].values, rb["seed"].values)
    resumed = [r for r in Session_results(b) if r["resumed_stages"]]
    assert resumed, "the resumed iteration should report the stages it did not recompute"
    # The store audits as the uninterrupted run's does (`spotlight audit`'s table): every
    # request complete, every checkpoint there, the same rewards; only resumes differ.
    rows = audit_table(b).rows
    assert all(r["requests"] == r["requests_complete"] for r in rows), rows
    assert sum(r["requests"] for r in rows) > 0 and rows[-1]["checkpoint"] == 2, rows
    steady = ("iteration", "requests", "checkpoint", "rollout_mean", "explore_mean")
    assert [{k: r[k] for k in steady} for r in rows] == \
        [{k: r[k] for k in steady} for r in audit_table(a).rows]


def Session_results(store: RunStore) -> list[dict]:
    out, k = [], 0
    while (rec := store.stage_record(f"iter-{k}/iteration")) is not None:
        out.append(rec["info"]["result"])
        k += 1
    return out


@pytest.fixture
def remote_cluster(tmp_path):
    """A real `dask scheduler` and `dask worker --resources` processes on loopback."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "distributed.cli.dask_"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(dask[:2] + ["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                          "--port", str(port), "--no-dashboard"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def worker(resource: str, name: str) -> None:
        """Start a stock worker and return once the scheduler lists it: a test's short connect
        timeout is then about the cluster's shape, not how fast a loaded machine starts it."""
        from distributed import Client

        procs.append(subprocess.Popen(
            dask[:2] + ["distributed.cli.dask_worker", address, "--nthreads", "1", "--name", name,
                        "--resources", f"{resource}=1", "--no-dashboard", "--memory-limit", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 180
        with Client(address, timeout=120) as client:
            while not any(w.get("name") == name for w in
                          client.scheduler_info(n_workers=-1)["workers"].values()):
                assert time.monotonic() < deadline, f"worker {name} never joined {address}"
                time.sleep(0.2)

    yield address, worker
    for p in procs:
        p.kill()
        p.wait()


def test_run_against_real_dask_scheduler_and_workers(remote_cluster, tiny_run_config, tmp_path):
    address, start_worker = remote_cluster
    start_worker("gpu", "gpu-remote")
    start_worker("spot", "spot-remote")
    tiny_run_config = tiny_run_config.with_values({"cluster.scheduler": address})
    with Session.from_config(tiny_run_config, store=str(tmp_path / "run")) as session:
        session.run(2)
        records = task_records(session.store, 2)
    on_spot = {"explore", "audit"}
    assert {r["worker"] for r in records if r["stage"] in on_spot} == {"spot-remote"}
    assert {r["worker"] for r in records if r["stage"] not in on_spot} == {"gpu-remote"}


def test_cluster_without_spot_worker_says_so_and_offers_the_fallback(remote_cluster,
                                                                      tiny_run_config, tmp_path):
    address, start_worker = remote_cluster
    start_worker("gpu", "gpu-only")
    tiny_run_config = tiny_run_config.with_values({"cluster.scheduler": address,
                                                   "cluster.connect_timeout_s": 5})
    with pytest.raises(ClusterError, match=r"no worker with resource 'spot'.*--mode sync"):
        Session.from_config(tiny_run_config, store=str(tmp_path / "a"))
    tiny_run_config = tiny_run_config.with_values({"cluster.missing_spot": "sync"})
    with Session.from_config(tiny_run_config, store=str(tmp_path / "b")) as session:
        assert session.mode == "sync"
        session.run(1)
        records = task_records(session.store, 1)
    assert {r["stage"] for r in records} >= {"rollout", "train"}
    assert all(r["worker"] == "gpu-only" for r in records)


def test_unreachable_scheduler_fails_fast_and_leaves_the_run_intact(tiny_run_config, tmp_path):
    with Session.from_config(tiny_run_config, store=str(tmp_path / "run"),
                             mode="vanilla") as session:
        session.run(1)
    before = (tmp_path / "run" / "manifest.json").read_bytes()
    nobody = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ClusterError, match=f"could not reach the Dask scheduler at {nobody}"):
        Session.resume(str(tmp_path / "run"), scheduler=nobody, connect_timeout_s=1)
    assert (tmp_path / "run" / "manifest.json").read_bytes() == before


def test_exploration_that_cannot_fill_a_group_is_refused(tiny_run_yaml):
    load_config(tiny_run_yaml, {"grpo.micro_batch": 6})   # micro-batches need not hold groups
    with pytest.raises(ConfigError, match=r"exploration.candidates = 3 cannot fill a group"):
        load_config(tiny_run_yaml, {"exploration.candidates": 3})
