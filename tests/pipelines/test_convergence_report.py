"""bench convergence's bookkeeping on hand-made jobs: figures computed by hand, the saved-job
store that makes it resumable, and how long the cluster check runs. No model runs here."""
from __future__ import annotations

import json
import os

import pytest

from pipelines.bench.bench_modes import planned_ratio
from pipelines.bench.convergence import measured_time_model
from pipelines.bench.convergence_plot import shown_ratios
from pipelines.bench.convergence_report import (
    cluster_check,
    hourly_usd,
    same_validations,
    summarize,
)
from pipelines.bench.convergence_table import markdown_table
from pipelines.bench.convergence_time import (
    planned_iteration,
    seconds_per_iteration,
    stage_seconds,
)
from pipelines.bench.paired import (
    BenchWorkerLost,
    Job,
    PairedPlan,
    PairedStore,
    run_jobs,
    time_left_s,
)
from pipelines.front.cli import EXIT_TASK, _classify
from pipelines.run.inprocess import InProcessHistory, IterationSummary
from spotlight.config import load_config, shipped_config
from tests.pipelines import paired_runners

CONFIG = load_config(shipped_config("digits.yaml"))
TARGET = 0.30


def job(curve, group_std=0.2, audits=(), lag_taus=None):
    its = [{"iteration": k, "group_std": group_std,
            "audit_tau": audits[k] if k < len(audits) else None} for k in range(10)]
    return {"val_curve": curve, "iterations": its, "lag_taus": lag_taus or {}}


def cluster(seconds, curve=(), reached=None, wall=None):
    # Iteration 0 (warm-up) and the validating iterations are left out of the median.
    return {"iteration_s": [99.0, seconds, seconds, 50.0], "validated": [False, False, False, True],
            "val_curve": list(curve), "iterations_to_target": reached, "time_to_target_s": wall,
            "wall_s": 149.0 + 2 * seconds}


def saved_jobs():
    return {
        # seed 0: vanilla reaches 0.30 at 10, sync at 4, stale at 5, spotlight at 2.5
        # (interpolated).
        "vanilla-seed0": job([[0, 0.2], [5, 0.25], [10, 0.3]], group_std=0.2),
        "sync-seed0": job([[0, 0.2], [5, 0.325], [10, 0.35]], group_std=0.3),
        "stale-seed0": job([[0, 0.2], [5, 0.3], [10, 0.35]], group_std=0.25,
                           audits=[None, 0.8, 0.6],
                           lag_taus={"10": {"1": 0.9, "2": 0.7, "4": None}}),
        "spotlight-seed0": job([[0, 0.2], [5, 0.4], [10, 0.4]], group_std=0.3,
                               audits=[None, 0.1]),
        # seed 1: vanilla never (counted at budget + every = 15), sync 5, stale 10, spotlight 5.
        "vanilla-seed1": job([[0, 0.2], [5, 0.22], [10, 0.24]], group_std=0.2),
        "sync-seed1": job([[0, 0.2], [5, 0.3], [10, 0.3]], group_std=0.3),
        "stale-seed1": job([[0, 0.2], [5, 0.25], [10, 0.3]], group_std=0.25,
                           audits=[None, 1.0]),
        "spotlight-seed1": job([[0, 0.2], [5, 0.3], [10, 0.35]], group_std=0.3),
        "cluster-vanilla-seed0": cluster(10.0),
        # The cluster saw sync's target at its validation at 5 (harness crossing: 4), 110 s in.
        "cluster-sync-seed0": cluster(20.0, [[0, 0.2], [5, 0.325]], reached=5, wall=110.0),
        "cluster-stale-seed0": cluster(11.0),
    }


FACTS = {"modes": ["vanilla", "sync", "stale", "spotlight"], "target": TARGET, "iterations": 10,
         "validation_every": 5, "task": "ocr"}


def test_summary_figures_by_hand(tmp_path):
    result = summarize(saved_jobs(), FACTS, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["seeds"] == 2
    its = result["iterations_to_target"]
    assert its["vanilla"] == [10.0, None] and its["stale"] == [5.0, 10.0]
    assert its["sync"] == pytest.approx([4.0, 5.0])
    assert its["spotlight"] == pytest.approx([2.5, 5.0])
    assert result["unreached"]["vanilla"] == 1
    # The planner's plans fit the window the stale cluster run measured: its seconds.
    assert result["seconds_per_iteration"] == {"vanilla": 10.0, "sync": 20.0, "stale": 11.0,
                                               "spotlight": 11.0}
    assert result["time_to_target_s"]["vanilla"] == [100.0, 150.0]
    assert result["time_to_target_s"]["spotlight"] == pytest.approx([27.5, 55.0])
    # The headline is the product (stale exploration with the planner) ...
    assert result["speedup_vs_vanilla"]["per_seed"] == pytest.approx([100 / 27.5, 150 / 55])
    assert result["speedup_vs_sync"]["per_seed"] == pytest.approx([80 / 27.5, 100 / 55])
    assert result["iteration_speedup_vs_vanilla"]["per_seed"] == pytest.approx([4.0, 3.0])
    lo, hi = result["speedup_vs_vanilla"]["ci90"]
    assert 150 / 55 - 1e-9 <= lo <= hi <= 100 / 27.5 + 1e-9   # within the seeds' ratios
    # ... the staleness cost is stale against fresh at the same fixed arm.
    assert result["staleness_cost"]["per_seed"] == pytest.approx([5 / 4, 10 / 5])
    assert result["speedup_by_mode"]["stale"]["vs_vanilla"]["per_seed"] == \
        pytest.approx([100 / 55, 150 / 110])
    assert result["group_std_gain"] == pytest.approx({"vanilla": 1.0, "sync": 1.5,
                                                      "stale": 1.25, "spotlight": 1.5})
    check = result["cluster_check"]["sync"]
    assert check["curve_matches_harness"] and check["estimate_s"] == 5 * 20.0
    assert check["relative_error"] == pytest.approx((100.0 - 110.0) / 110.0)
    assert check["reached_target"] and check["wall_s"] == 110.0
    # Vanilla's cluster run stopped at the budget short of the target: its 4 iterations' wall
    # time against 4 x its seconds per iteration.
    check = result["cluster_check"]["vanilla"]
    assert not check["reached_target"] and check["iterations"] == 4
    assert check["relative_error"] == pytest.approx((40.0 - 169.0) / 169.0)
    by_mode = result["speedup_by_mode"]
    assert by_mode["spotlight"]["vs_vanilla"] == result["speedup_vs_vanilla"]
    assert by_mode["sync"]["vs_sync"] is None
    assert by_mode["sync"]["iterations_vs_vanilla"]["per_seed"] == pytest.approx([10 / 4, 15 / 5])
    tau = result["kendall_tau"]
    assert tau["audits"] == 3 and tau["median"] == pytest.approx(0.8)
    assert tau["by_staleness"]["1"]["median"] == 0.9 and tau["by_staleness"]["2"]["probes"] == 1
    assert "4" not in tau["by_staleness"]          # θ_10-4 was not probed (None)
    # Every mode that explores with stale weights reports its own audits; the headline stays the
    # fixed arm's.
    assert set(result["kendall_tau_by_mode"]) == {"stale", "spotlight"}
    assert result["kendall_tau_by_mode"]["spotlight"]["audits"] == 1
    assert result["kendall_tau_by_mode"]["spotlight"]["median"] == pytest.approx(0.1)
    assert result["kendall_tau_by_mode"]["stale"] == tau
    # Dollars: hours x the cluster's hourly price; vanilla rents no spot worker.
    gpu_only, with_spot = hourly_usd(CONFIG, "vanilla"), hourly_usd(CONFIG, "spotlight")
    assert with_spot > gpu_only > 0 and hourly_usd(CONFIG, "stale") == with_spot
    assert result["cost_to_target_usd"]["vanilla"][0] == pytest.approx(100 / 3600 * gpu_only)
    assert result["cost_to_target_usd"]["spotlight"][0] == pytest.approx(27.5 / 3600 * with_spot)
    # Medians to the target with their intervals; vanilla's unreached seed counts past the cap
    # (10 + 5).
    medians = result["to_target"]["vanilla"]
    assert medians["time_s"]["median"] == 125.0 and medians["time_s"]["ci90"] == [100.0, 150.0]
    assert medians["iterations"]["per_seed"] == [10.0, 15.0]
    assert result["to_target"]["spotlight"]["cost_usd"]["per_seed"] == \
        pytest.approx(result["cost_to_target_usd"]["spotlight"])
    # Area under the curve: seed 0's vanilla (0.2, 0.25, 0.3 at 0, 5, 10) -> mean 0.25.
    assert result["auc"]["vanilla"]["per_seed"][0] == pytest.approx(0.25)
    assert result["value_at_budget"]["sync"] == [0.35, 0.3]
    assert (tmp_path / "c.png").stat().st_size > 0


def test_geneval_reports_the_strict_score_per_tag(tmp_path):
    config = load_config(shipped_config("digits-geneval.yaml"))
    jobs = saved_jobs()
    prompts = config.validation.max_prompts   # 64 validation prompts x 4 seeds
    for seed in (0, 1):
        jobs[f"vanilla-seed{seed}"]["budget_val_rewards"] = [[0.5] * 4] * prompts
        jobs[f"sync-seed{seed}"]["budget_val_rewards"] = [[1.0, 1.0, 0.5, 0.5]] * prompts
        jobs[f"stale-seed{seed}"]["budget_val_rewards"] = [[1.0] * 4] * prompts
        jobs[f"spotlight-seed{seed}"]["budget_val_rewards"] = [[1.0] * 4] * prompts
    strict = summarize(jobs, FACTS, [0, 1], config, tmp_path / "c.png")["strict_at_budget"]
    assert {m: s["strict"] for m, s in strict.items()} == {"vanilla": 0.0, "sync": 0.5,
                                                           "stale": 1.0, "spotlight": 1.0}
    assert set(strict["sync"]["strict_by_tag"]) >= {"counting", "color_attr"}
    assert set(strict["sync"]["strict_by_tag"].values()) == {0.5}
    assert strict["vanilla"]["partial_mean"] == 0.5


def test_a_planned_mode_plans_on_the_stale_cluster_run_without_the_stale_harness_jobs(
        tmp_path):
    """The fixed arm's harness jobs are the dearest a bench runs and the headline does not need
    them: without ``stale`` in the modes its cluster run still times the planned mode."""
    saved = {k: v for k, v in saved_jobs().items() if not k.startswith("stale-")}
    facts = {**FACTS, "modes": ["vanilla", "sync", "spotlight"]}
    result = summarize(saved, facts, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["seeds"] == 2 and "stale" not in result["iterations_to_target"]
    assert result["seconds_per_iteration"]["spotlight"] == 11.0
    assert result["time_to_target_s"]["spotlight"] == pytest.approx([27.5, 55.0])
    assert result["speedup_vs_vanilla"]["per_seed"] == pytest.approx([100 / 27.5, 150 / 55])
    # Without the fixed arm the headline τ is the product's own audits.
    assert result["kendall_tau"] == result["kendall_tau_by_mode"]["spotlight"]
    assert result["kendall_tau"]["audits"] == 1
    assert result["kendall_tau"]["median"] == pytest.approx(0.1)


def test_summary_waits_for_whole_seeds(tmp_path):
    jobs = {k: v for k, v in saved_jobs().items() if k != "sync-seed1"}
    result = summarize(jobs, FACTS, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["seeds"] == 1 and result["seed_list"] == [0]
    assert summarize({}, FACTS, [0, 1], CONFIG, tmp_path / "c.png")["seeds"] == 0


def test_the_job_store_resumes_only_its_own_bench(tmp_path):
    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.2)
    store = PairedStore.open(tmp_path, plan, resume=False)
    store.save("vanilla-seed0", {"x": 1})
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="--resume"):
        PairedStore.open(tmp_path, plan, resume=False)
    assert PairedStore.open(tmp_path, plan, resume=True).loaded == {"vanilla-seed0": {"x": 1}}
    other = PairedPlan(CONFIG.with_values({"grpo.lr": 1e-3}), 10, 5, 0.2)
    with pytest.raises(ValueError, match="other settings"):
        PairedStore.open(tmp_path, other, resume=True)
    # The run seed is per job, not part of the plan.
    assert PairedPlan(CONFIG.with_values({"seed": 5}), 10, 5, 0.2).fingerprint() == \
        plan.fingerprint()
    assert json.loads((tmp_path / "vanilla-seed0.json").read_text())["result"] == {"x": 1}


def test_a_part_saved_before_a_setting_was_added_resumes_while_that_setting_is_at_default(
        tmp_path):
    """A bench spans sessions, and a later Spotlight may add a setting: a part saved without it
    ran it at its default, so it stays this bench's -- unless the bench now sets it otherwise,
    which the refusal names."""
    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.2)
    PairedStore.open(tmp_path, plan, resume=False).save("nft-vanilla-seed0", {"x": 1})
    path = tmp_path / "nft-vanilla-seed0.json"
    older = json.loads(path.read_text())
    del older["settings"]["objective.sampling_ema"]   # as saved before the setting existed
    older["fingerprint"] = "hash-of-the-older-config"
    path.write_text(json.dumps(older))
    assert PairedStore.open(tmp_path, plan, resume=True).loaded == {"nft-vanilla-seed0": {"x": 1}}
    soft = PairedPlan(CONFIG.with_values({"objective.kind": "nft",
                                          "objective.sampling_ema": 0.5}), 10, 5, 0.2)
    with pytest.raises(ValueError, match=r"other settings \(objective.kind, "
                                         r"objective.sampling_ema\)"):
        PairedStore.open(tmp_path, soft, resume=True)
    older["settings"]["grpo.lr"] = 1.0   # a setting the part names, at another value
    path.write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"other settings \(grpo.lr\)"):
        PairedStore.open(tmp_path, plan, resume=True)


def test_a_part_from_another_base_is_refused_with_both_bases_named(tmp_path):
    """A bench whose shipped models folder was lost pretrains a base that validates otherwise
    (another CPU's): the refusal names both values and how to go on, and leaves the saved part
    as it was."""
    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.251)
    saved = {"base_val_reward": 0.251}
    store = PairedStore.open(tmp_path, plan, resume=False)
    store.save("cluster-vanilla-seed0", {"wall_s": 1.0})   # read first, and keeps no base
    store.save("vanilla-seed0", saved)
    before = (tmp_path / "vanilla-seed0.json").read_bytes()
    elsewhere = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.261)
    with pytest.raises(ValueError, match=r"at 0\.2510.*at 0\.2610.*models/ folder"):
        PairedStore.open(tmp_path, elsewhere, resume=True)
    assert (tmp_path / "vanilla-seed0.json").read_bytes() == before
    assert PairedStore.open(tmp_path, plan, resume=True).loaded["vanilla-seed0"] == saved


def test_parts_saved_under_the_old_mode_names_are_refused_not_misread(tmp_path, monkeypatch):
    """Before the rename a 'spotlight' part was the fixed-arm stale mode: read today it would
    pass for the planner's run."""
    import pipelines.bench.paired as paired

    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.2)
    monkeypatch.setattr(paired, "MODE_NAMES", 1)
    PairedStore.open(tmp_path, plan, resume=False).save("spotlight-seed0", {"x": 1})
    monkeypatch.setattr(paired, "MODE_NAMES", 2)
    with pytest.raises(ValueError, match="mode names differ"):
        PairedStore.open(tmp_path, plan, resume=True)


def test_the_headline_table_puts_iterations_beside_time(tmp_path):
    facts = dict(FACTS, base_val_reward=0.2, base_val_standard_error=0.01, seeds_asked=2,
                 product="spotlight")
    assert markdown_table(summarize({}, facts, [0, 1], CONFIG, tmp_path / "c.png")) == ""
    lines = markdown_table(summarize(saved_jobs(), facts, [0, 1], CONFIG, tmp_path / "c.png")
                           ).splitlines()
    assert lines[0].startswith("ocr: 2 of 2 paired seeds; base validation 0.2000 (standard "
                               "error 0.0100), target 0.3000")
    rows = {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:])}
    # By hand: vanilla reaches 0.30 at 10 and never (15) at 10 s an iteration; sync at 4 and 5
    # at 20 s; the planned mode at 2.5 and 5 at stale's 11 s, its plans fitting the window.
    assert rows["vanilla (best baseline)"] == [
        "12.5 [10.0, 15.0]", "1 of 2", "10.0", "-", "125 [100, 150]", "-", "-"]
    assert rows["sync"][:5] == ["4.5 [4.0, 5.0]", "0 of 2", "20.0", "-", "90 [80, 100]"]
    assert rows["sync"][6] == "1.38 [1.25, 1.50]"   # 100 / 80 and 150 / 100
    assert rows["spotlight (product)"][:5] == ["3.8 [2.5, 5.0]", "0 of 2", "11.0", "0.0",
                                               "41 [27, 55]"]
    assert "gpu path" not in "\n".join(lines)   # cluster parts saved before stages were kept
    jobs = saved_jobs()
    jobs["cluster-vanilla-seed0"]["stage_s"] = {"rollout": 4.0, "reward": 0.5, "advantages": 0.1,
                                                "train": 5.0, "checkpoint": 0.4}
    result = summarize(jobs, facts, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["stage_s"] == {"vanilla": jobs["cluster-vanilla-seed0"]["stage_s"]}
    stages = markdown_table(result).split("\n\n")[-1].splitlines()
    assert stages[0] == ("| gpu path, seconds an iteration | rollout | reward | train | other "
                         "| all |")
    assert stages[2:] == ["| vanilla | 4.0 | 0.5 | 5.0 | 0.5 | 10.0 |"]


def test_the_gpu_path_by_stage_spans_each_stage_and_leaves_the_spot_work_out():
    records = [
        # Iteration 1: a rollout in two chunks on two workers (1-5 s), reward, then training.
        {"stage": "rollout", "iteration": 1, "start": 1.0, "end": 4.0},
        {"stage": "rollout", "iteration": 1, "start": 2.0, "end": 5.0},
        {"stage": "reward", "iteration": 1, "start": 5.0, "end": 6.0},
        {"stage": "train", "iteration": 1, "start": 6.0, "end": 12.0},
        {"stage": "explore", "iteration": 2, "start": 1.0, "end": 11.0},
        # Iteration 2 trained on explored samples: no reward stage (0 s in it).
        {"stage": "rollout", "iteration": 2, "start": 20.0, "end": 20.5},
        {"stage": "train", "iteration": 2, "start": 20.5, "end": 28.5},
        # Iteration 3 validated and iteration 0 warmed up: not among those asked. Validation
        # is numbered by the weights it validates (iteration 0's: 1), and left out.
        {"stage": "validation", "iteration": 1, "start": 0.0, "end": 1.0},
        {"stage": "train", "iteration": 3, "start": 30.0, "end": 90.0}]
    by_stage = stage_seconds(records, [1, 2])
    assert list(by_stage) == ["rollout", "reward", "train"]
    assert by_stage == {"rollout": pytest.approx(2.25), "reward": pytest.approx(0.5),
                        "train": pytest.approx(7.0)}
    assert stage_seconds(records, []) == {}


def test_seconds_per_iteration_leave_out_the_warm_up_and_validations():
    assert seconds_per_iteration(cluster(12.0)) == 12.0
    assert seconds_per_iteration({"iteration_s": [3.0], "validated": [True]}) == 3.0


def test_a_planned_mode_is_timed_without_the_stale_runs_wait_for_exploration(tmp_path):
    # The fixed-arm stale run waited 6 s an iteration for the next one's exploration (spot
    # capacity short of its arm); the planner fits its plans to the window, so not its modes.
    assert seconds_per_iteration(dict(cluster(12.0), explore_wait_s=[0.0, 6.0, 7.0, 0.0]),
                                 fitted=True) == 5.5
    assert seconds_per_iteration(dict(cluster(12.0), explore_wait_s=[0.0, 6.0, 7.0, 0.0])) == 12.0
    jobs = saved_jobs()
    jobs["cluster-stale-seed0"]["explore_wait_s"] = [0.0, 4.0, 4.0, 0.0]
    result = summarize(jobs, FACTS, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["seconds_per_iteration"]["stale"] == 11.0
    assert result["seconds_per_iteration"]["spotlight"] == 7.0
    # Every mode's wait for exploration is reported beside its seconds: measured where the
    # cluster ran it, modelled (0 here: its plans fit) for the planned mode.
    assert result["explore_wait_s"] == {"vanilla": None, "sync": None, "stale": 4.0,
                                        "spotlight": 0.0}


def test_a_planned_mode_on_explored_samples_pays_its_rollouts_and_overruns():
    """Modelled seconds per iteration: the gpu path of the stale run (8 s, no rollout), a
    sampled rollout (5 s) where the plan left prompts unexplored, and a plan that overruns
    the gpu path on the spot slots (32 x 16 x 10 x 0.003 s = 15.36 s on one slot)."""
    its = [{"iteration": 0, "plan": [16, 10, 32], "trained_on_explored": False},
           {"iteration": 1, "plan": [16, 6, 32], "trained_on_explored": True},
           {"iteration": 2, "plan": [16, 6, 20], "trained_on_explored": True},
           {"iteration": 3, "plan": [16, 6, 32], "trained_on_explored": False},
           {"iteration": 4, "plan": [16, 6, 32], "trained_on_explored": True, "sampled": 0.5}]
    job = {"iterations": its, "time_model": [9.0, 0.003, 5.0]}
    # 0: the first rollout every mode samples; 1: 9.216 s of exploration > 8; 2: fits;
    # 3: a sampled rollout, 8 + 5; 4: half its prompts explored, half sampled, 8 + 2.5.
    def seconds(mode, iterations):
        return planned_iteration(mode, job, 8.0, iterations, 1).seconds

    assert seconds("reuse-spotlight", 4) == pytest.approx((15.36 + 9.216 + 8.0 + 13.0) / 4)
    assert seconds("reuse-spotlight", 5) == pytest.approx((15.36 + 9.216 + 8.0 + 13.0 + 10.5) / 5)
    assert seconds("reuse-spotlight", 2) == pytest.approx((15.36 + 9.216) / 2)   # to the target
    # Twice the spot slots halve exploration; a mode that always samples pays no extra rollout.
    assert seconds("reuse-spotlight-x2", 4) == pytest.approx((8.0 + 8.0 + 8.0 + 13.0) / 4)
    assert seconds("nft-spotlight-x2", 4) == pytest.approx(8.0)
    # The overruns are the iteration's wait for exploration: 7.36 s and 1.216 s of the first two.
    assert planned_iteration("reuse-spotlight", job, 8.0, 4, 1).explore_wait_s == \
        pytest.approx((7.36 + 1.216) / 4)
    assert planned_iteration("reuse-spotlight-x2", job, 8.0, 4, 1).explore_wait_s == 0.0


def test_the_cluster_check_compares_the_validations_both_ran():
    harness = [(0, 0.24), (5, 0.242), (10, 0.23)]
    # The cluster stopped at 7 and validated there too (the driver validates the last one).
    assert same_validations(harness, [[0, 0.24], [5, 0.242], [7, 0.225]])
    assert not same_validations(harness, [[0, 0.24], [5, 0.243], [7, 0.225]])
    assert not same_validations(harness, [[0, 0.24], [7, 0.225]])   # nothing to compare


def test_the_cluster_check_waits_for_its_seeds_harness_job():
    """Seed 1's harness job can finish before seed 0's: a report then has seed 0's cluster run
    and nothing to hold it against yet (it once ended a bench with a KeyError)."""
    run = {"iterations_to_target": 5, "iteration_s": [2.0] * 5, "time_to_target_s": 10.0,
           "wall_s": 10.0, "val_curve": [[0, 0.2], [5, 0.25]]}
    saved = {"nft-vanilla-seed1": {"val_curve": [[0, 0.2], [5, 0.23]]}}
    assert cluster_check({"nft-vanilla": run}, saved, 0, 0.24, {"nft-vanilla": 2.0}) == {}
    saved["nft-vanilla-seed0"] = {"val_curve": [[0, 0.2], [5, 0.25]]}
    checked = cluster_check({"nft-vanilla": run}, saved, 0, 0.24, {"nft-vanilla": 2.0})
    assert checked["nft-vanilla"]["curve_matches_harness"] is True


def test_planned_modes_plan_on_the_stale_runs_measured_time(tmp_path):
    records = []
    for k in (0, 1):   # rollout 0-4 s, train 4-10 s (k = 1: 100 s later); two explore tasks
        t = 100.0 * k
        records += [{"stage": "rollout", "iteration": k, "start": t, "end": t + 4},
                    {"stage": "train", "iteration": k, "start": t + 4, "end": t + 10 + k},
                    {"stage": "explore", "iteration": k + 1, "start": t, "end": t + 2,
                     "samples": 4, "steps": 10}]
    window, per_step, rollout_s = measured_time_model(records, "iteration")
    assert window == pytest.approx(10.5) and per_step == pytest.approx(4.0 / 80)
    assert rollout_s == pytest.approx(4.0)
    # An iteration trained on explored samples sampled no rollout: its 0.1 s is not one.
    explored = [dict(r, explored="explore", end=r["start"] + 0.1) if r["stage"] == "rollout"
                and r["iteration"] == 1 else r for r in records]
    assert measured_time_model(explored, "iteration")[2] == pytest.approx(4.0)
    assert measured_time_model(records, "train")[0] == pytest.approx(6.5)
    assert measured_time_model([r for r in records if r["stage"] != "explore"], "train") is None
    assert [planned_ratio(m) for m in ("spotlight", "spotlight-x4", "stale", "spotlight-xx")] \
        == [1, 4, None, None]
    jobs = saved_jobs()
    for seed in (0, 1):
        jobs[f"spotlight-x4-seed{seed}"] = dict(jobs[f"spotlight-seed{seed}"])
    jobs["spotlight-x4-seed0"]["iterations"] = [dict(it, plan=[24, 7, 32]) for it in
                                                jobs["spotlight-x4-seed0"]["iterations"]]
    facts = dict(FACTS, modes=FACTS["modes"] + ["spotlight-x4"])
    result = summarize(jobs, facts, [0, 1], CONFIG, tmp_path / "c.png")
    assert result["seconds_per_iteration"]["spotlight-x4"] == 11.0   # stale's
    assert hourly_usd(CONFIG, "spotlight-x4") > hourly_usd(CONFIG, "spotlight")
    assert result["planner_choices"]["spotlight-x4"][0] == [1, 24, 7, 32]
    assert {"spotlight", "spotlight-x4"}.isdisjoint(result["cluster_check"])
    # Same iterations as spotlight at the same seconds: the same ratios, drawn beside it, as
    # is the fixed-arm stale mode's.
    assert result["speedup_by_mode"]["spotlight-x4"] == result["speedup_by_mode"]["spotlight"]
    assert [label for label, _ in shown_ratios(result)][-2:] == [
        "time: vanilla / stale", "time: vanilla / spotlight-x4"]


def test_a_job_stops_once_it_has_run_the_budget_and_reached_the_target():
    plan = PairedPlan(CONFIG, iterations=30, every=5, base_val_reward=0.2, target=0.3, budget=10)
    run = InProcessHistory("vanilla", 0, 0.2)
    for k, val in enumerate([0.31] + [None] * 3 + [0.25] * 6):
        run.iterations.append(IterationSummary(k, 0.0, 0.0, "random", val_reward=val))
        # Reached at iteration 1, but the budget's value is not read before iteration 10.
        assert plan.done(run) == (k + 1 == 10), k
    assert not PairedPlan(CONFIG, 30, 5, 0.2, budget=10).done(run)   # no target: run them all
    assert PairedPlan(CONFIG, 30, 5, 0.2, target=0.3, budget=10).fingerprint() != \
        PairedPlan(CONFIG, 30, 5, 0.2, target=0.3, budget=20).fingerprint()


def test_a_bench_resumes_from_another_checkout(tmp_path):
    """The config names its prompt files by path; the plan counts them by their contents."""
    plans = []
    for folder in ("a", "b"):
        copy = tmp_path / folder
        copy.mkdir()
        for name in ("train.txt", "val.txt"):
            (copy / name).write_text(f"{name}\n12\n")
        plans.append(PairedPlan(CONFIG.with_values({
            "world.train_prompts": str(copy / "train.txt"),
            "world.val_prompts": str(copy / "val.txt")}), 10, 5, 0.2))
    assert plans[0].fingerprint() == plans[1].fingerprint()
    (tmp_path / "b" / "val.txt").write_text("val.txt\n13\n")
    assert plans[0].fingerprint() != plans[1].fingerprint()


def test_the_time_left_follows_the_pace_of_this_sitting():
    assert time_left_s(600.0, 4, 6) == 900.0   # 150 s of wall time per job finished
    assert time_left_s(0.0, 0, 6) != time_left_s(0.0, 0, 6)   # nothing finished yet: unknown


def test_each_job_runs_in_a_process_of_its_own(tmp_path):
    """Memory a job leaves behind cannot pile up over a bench's jobs (a reused worker grew to
    8.8 GiB over forty OCR jobs and was killed)."""
    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.2)
    store = PairedStore.open(tmp_path, plan, resume=False)
    jobs = [Job("vanilla", seed) for seed in range(3)]
    run_jobs(plan, jobs, store, workers=2, runner=paired_runners.pid_job)
    pids = {store.loaded[job.name]["pid"] for job in jobs}
    assert len(pids) == 3 and os.getpid() not in pids, store.loaded


def test_a_killed_worker_stops_the_bench_with_what_to_do_and_keeps_the_finished_jobs(tmp_path):
    """The job beside the killed one finishes and is saved; none starts after it."""
    plan = PairedPlan(CONFIG, iterations=10, every=5, base_val_reward=0.2)
    store = PairedStore.open(tmp_path, plan, resume=False)
    jobs = [Job("vanilla", seed) for seed in range(4)]
    expected = "running vanilla-seed1 died.*out of memory.*--resume"
    with pytest.raises(BenchWorkerLost, match=expected) as err:
        run_jobs(plan, jobs, store, workers=2, runner=paired_runners.killed_job)
    assert str(tmp_path) in str(err.value)
    saved = set(PairedStore.open(tmp_path, plan, resume=True).loaded)
    assert {"vanilla-seed0"} <= saved <= {"vanilla-seed0", "vanilla-seed2"}, saved
    assert "vanilla-seed3" not in saved
    assert _classify(err.value)[0] == EXIT_TASK
