"""``spotlight bench faults`` scenarios at test size on the network-namespace test bed: each
fault injected into a real run across hosts (TLS scheduler, stock workers, S3 host, driver),
then the run compared with the clean one. The scenarios share one bed and one clean run (the
``bench`` fixture), as the command's do; the installed command's test, first, builds its own."""
from __future__ import annotations

import json

import pytest

from pipelines.bench import fault_scenarios
from pipelines.bench.bed_cluster import start_bed_cluster
from pipelines.bench.fault_scenarios import Bench, Driver
from pipelines.bench.faults import targets_met, write_bench_config
from tests.pipelines.conftest import run_quick_bench, write_tiny_world

pytestmark = pytest.mark.timeout(1800)

# Requests long enough that one is under way on the host a partition cuts off, found by its
# heartbeats in 10 s here (20 by default); a driver that lost its scheduler stops after 8 s of
# it (the default, 30 s, waits out a restart).
TEST_SIZE = {"sampler.num_steps": 60, "exploration.candidates": 24,
             "preemption.heartbeat_silence_s": 10, "cluster.worker_wait_s": 8}
# A killed driver's run is taken over once its lease expires: 10 s after its last renewal here
# (`spotlight run --lease-ttl`), 30 by default.
LEASE_TTL_S = 10


def test_bench_faults_quick_from_outside_the_repository(netns, tmp_path, outside_repo):
    """The installed command builds its own bed (the zombie scenario needs no clean run)."""
    result, _ = run_quick_bench("faults", ["--scenarios", "zombie"], outside_repo,
                                tmp_path / "faults.json", timeout=600)
    assert result["complete"] and result["tls"] and result["targets"] == {"zombie": True}, result
    assert {"scheduler", "store", "spot-0", "spot-1"} <= set(result["hosts"]), result
    assert result["scenarios"]["zombie"]["stale_steps_stored"], result


@pytest.fixture(scope="module")
def bed_bench(module_testbed, tiny_world_learns, tmp_path_factory) -> Bench:
    """One bed and one cluster for the module: the scenario tests below run on them in the
    order ``spotlight bench faults`` runs its scenarios (each fault's run has a store of its
    own; the scheduler's loss comes last, as it moves the scheduler)."""
    root = tmp_path_factory.mktemp("faults")
    config = write_tiny_world(root)
    cluster = start_bed_cluster(module_testbed, root / "bed", gpu=1, spot=2,
                                spare=("driver-2", "scheduler-2"))
    return Bench(module_testbed, cluster, write_bench_config(root, str(config), False, TEST_SIZE),
                 2, root, driver_options=("--lease-ttl", str(LEASE_TTL_S)))


@pytest.fixture(scope="module")
def clean(bed_bench) -> Driver:
    """The clean run every scenario is compared with, as its driver finished it."""
    return fault_scenarios.run_clean(bed_bench)


@pytest.fixture(scope="module")
def bench(bed_bench, clean) -> Bench:
    return bed_bench


def test_a_run_across_hosts_keeps_its_state_on_the_s3_host(bench, clean):
    """The clean run: scheduler, S3 store, gpu and spot workers and the driver each on its own
    host, all over TLS; its state is on the S3 host, read back as an auditor would."""
    printed = clean.out.text()
    assert f"run: {bench.clean_url}" in printed and "done: 2 iterations" in printed, printed
    store = bench.store(bench.clean_url)
    assert store.is_stage_done("iter-1/iteration") and store.latest_checkpoint() == 2
    workers = {r["worker"] for r in store.get_json("iter-0/iteration", "tasks")["tasks"]}
    assert workers <= {"gpu-0", "spot-0", "spot-1"} and "gpu-0" in workers, workers


def test_a_partition_and_a_second_driver_lose_nothing_and_mix_nothing(bench):
    """spot-1's link goes down while it explores (Dask still lists it: its TTL is minutes): the
    pool notices (from the silence, or Dask's own loss of the connection on a loaded machine),
    takes its request back and gives it nothing more until the heal. A second driver from
    another host is refused in one line without disturbing the first; a forced takeover fences
    the first, which says so in one line."""
    found = {"partition": fault_scenarios.partition(bench, heal_after_s=20.0),
             "dual_driver": fault_scenarios.dual_driver(bench)}
    cut, dual = found["partition"], found["dual_driver"]
    assert cut["moved_requests"] >= 1 and cut["requeued"] >= 1, found
    assert cut["assigned_while_cut"] == 0, found
    assert dual["refused_exit"] == 3 and dual["first_exit"] == 6, found
    assert len(dual["refused"]) == 1 and f"(pid {dual['first_pid']}," in dual["refused"][0] \
        and "expires in" in dual["refused"][0], found
    assert not dual["refused_started"] and dual["first_undisturbed"], found
    assert any("(took over from host " in line and f"pid {dual['first_pid']}, epoch 1)" in line
               for line in dual["taker_lease"]), found
    assert [line.split(":")[1] for line in dual["first_errors"]] == [" fenced"], found
    assert dual["tracebacks"] == 0, found
    store = bench.store(bench.cluster.store_url("dual"))
    lease, manifest = (json.loads(store.location.read_bytes(name, small=True))
                       for name in ("lease.json", "manifest.json"))
    assert manifest["writer_epoch"] == lease["epoch"] == 2 and lease["released"], lease
    taken = [e for e in store.read_events() if e["kind"] == "lease" and e.get("took_over_from")]
    assert [(e["epoch"], e["took_over_from"]["pid"]) for e in taken] == \
        [(2, dual["first_pid"])], taken
    assert targets_met(found) == {"partition": True, "dual_driver": True}, found


def test_two_attempts_on_two_hosts_with_different_kernels_never_mix(bench):
    """The cut-off attempt writes on after the heal (its steps are in the store) but none of
    them is in the trajectory, which is exactly the winner's lineage."""
    found = fault_scenarios.zombie(bench)
    assert found["stale_steps_stored"], found   # the stale attempt did write after the takeover
    assert found["identical_to_clean"] and found["foreign_writes"] == 0, found
    assert found["requests_lost"] == 0 and found["lineage"][-1][1] == "latent-e1a2", found
    assert "fenced" in found["stale_attempt"], found


def test_a_store_outage_within_the_patience_costs_a_pause(bench):
    found = fault_scenarios.store_outage(bench, outage_s=10.0)
    assert targets_met({"store_outage": found}) == {"store_outage": True}, found
    assert found["detect_s"] is not None and found["recover_s"] is not None, found


def test_a_lost_driver_host_and_a_lost_scheduler_host_finish_identically(bench):
    """The driver is SIGKILLed and a driver on another host is started at once with
    --takeover: it waits the unrenewed lease out and takes over.
    The scheduler is killed: the driver stops in one line, and the run resumes on a new
    scheduler on another host. Both end identical to the clean run."""
    found = {"driver_loss": fault_scenarios.driver_loss(bench),
             "scheduler_loss": fault_scenarios.scheduler_loss(bench)}
    lost = found["scheduler_loss"]
    assert lost["driver_exit"] == 4 and lost["tracebacks"] == 0, found
    assert "stopped answering" in lost["driver_error"] and "--scheduler" in lost["driver_error"], \
        found
    assert targets_met(found) == {"driver_loss": True, "scheduler_loss": True}, found
    assert found["driver_loss"]["lease_ttl_s"] == pytest.approx(LEASE_TTL_S, abs=0.01), found
    # It found the lease live (the kill was just before), said so, waited, and took it.
    assert found["driver_loss"]["takeover_waited_s"] is not None, found


def test_a_worker_cut_off_beside_the_cpu_hog_misses_its_target():
    """The CPU hog's target: a slow worker is not cut off (besides nothing lost or mixed)."""
    fine = {"requests_lost": 0, "identical_to_clean": True, "foreign_writes": 0}
    assert targets_met({"cpu_hog": {**fine, "false_cut_offs": 0}}) == {"cpu_hog": True}
    assert targets_met({"cpu_hog": {**fine, "false_cut_offs": 1}}) == {"cpu_hog": False}
