"""End-to-end through the real console entry point, on a tiny config (same code paths)."""
import json
import re
from pathlib import Path

import pytest
import yaml

from spotlight import main
from spotlight.config import PROJECT_ROOT as ROOT
from tests.pipelines.conftest import run_quick_bench, spotlight_cli

TINY = {
    "iterations": 2,
    "world": {"task": "ocr", "canvas_height": 12, "canvas_width": 32,
              "train_prompts": str(ROOT / "configs/prompts/ocr_train.txt"),
              "val_prompts": str(ROOT / "configs/prompts/ocr_val.txt")},
    "model": {"num_layers": 1, "num_attention_heads": 1, "attention_head_dim": 16, "text_dim": 16,
              "text_layers": 1},
    "pretrain": {"steps": 3, "batch_size": 8, "warmup_steps": 1},
    "grpo": {"prompts_per_iteration": 2, "group_size": 4, "micro_batch": 8},
    "sampler": {"num_steps": 3},
    "validation": {"max_prompts": 4, "every": 1},
}


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def test_demo_writes_report(tiny_yaml, tmp_path, capsys):
    report = tmp_path / "report"
    assert main(["demo", "--config", str(tiny_yaml), "--report", str(report),
                 "--store", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "validation reward before RL" in out and "validation reward after RL" in out
    assert re.search(r"\(gain [+-]\d\.\d{3}, 90% interval \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\] "
                     r"over 8 prompt-seed pairs\)", out), out   # 4 prompts x 2 seeds
    for name in ("validation_before.png", "validation_after.png", "reward_curve.png",
                 "timeline.png", "report.html"):
        assert (report / name).stat().st_size > 0
    page = (report / "report.html").read_text()
    assert all(f'<section id="{s}">' in page for s in ("summary", "rewards", "timeline", "cost"))
    summary = json.loads((report / "summary.json").read_text())
    assert summary["iterations"] == 2
    gain = summary["val_gain"]   # the last validation against the first, paired
    assert gain["pairs"] == 8 and gain["ci90"][0] <= gain["gain"] <= gain["ci90"][1]
    assert gain["gain"] == pytest.approx(summary["val_reward_after"] - summary["val_reward_before"])
    assert [p["iteration"] for p in summary["val_curve"]] == [0, 1, 2]


def test_bench_learning_quick_writes_contract_keys(tiny_yaml, tmp_path, outside_repo):
    result, _ = run_quick_bench("learning", ["--config", str(tiny_yaml)], outside_repo,
                                tmp_path / "bench.json", timeout=540)
    for key in ("base_val_reward", "final_val_reward", "val_curve", "iterations", "wall_s",
                "recognizer_accuracy", "zero_std_group_fraction", "machine"):
        assert key in result, key
    assert result["iterations"] >= 1 and result["recognizer_accuracy"] >= 0.97


def test_bench_convergence_quick_runs_paired_seeds_and_resumes(tiny_yaml, tmp_path,
                                                                outside_repo, monkeypatch):
    """Three modes, paired seeds in the harness (2 iterations each), the first seed's cluster
    checks, and spotlight's planner planning on the time the stale check measured: the contract
    keys, the plot, the cluster computing the harness's curve; a second call without --resume
    refuses to overwrite, with --resume it adds a seed and reruns nothing it had -- from the
    base and reward model it shipped with its parts, with an empty model cache."""
    out_json = tmp_path / "conv.json"
    args = ["--config", str(tiny_yaml), "--target", "2.0",
            "--modes", "vanilla,stale,spotlight", "--set", "grpo.lr=0.0001"]
    first, _ = run_quick_bench("convergence", args + ["--seeds", "1"], outside_repo, out_json,
                               timeout=300)
    parts = Path(first["parts"])
    saved = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.json")}
    assert set(saved) == {"vanilla-seed0.json", "stale-seed0.json", "spotlight-seed0.json",
                          "cluster-vanilla-seed0.json", "cluster-stale-seed0.json"}
    refused = spotlight_cli(["bench", "convergence", "--quick", *args, "--seeds", "2",
                             "--json", str(out_json)], outside_repo, timeout=120)
    assert refused.returncode == 2, refused.stderr   # without --resume: keeps what it has
    assert "--resume" in refused.stderr
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("*.json")} == saved
    shipped = json.loads((parts / "models" / "shipped.json").read_text())
    assert {name.split("/")[0].rsplit("-", 1)[0] for name in shipped["files"]} == \
        {"base-ocr", "recognizer"}
    assert shipped["base_val_reward"] == first["base_val_reward"]
    # Resumed as on another machine: an empty cache, so only the shipped models can serve.
    elsewhere = tmp_path / "another-machine-cache"
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(elsewhere))
    result, resumed = run_quick_bench("convergence", args + ["--seeds", "2", "--resume"],
                                      outside_repo, out_json, timeout=300)
    assert not [p.name for p in elsewhere.glob("*") if p.name.startswith(("base-", "recog"))]
    assert result["base_val_reward"] == first["base_val_reward"]
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("*.json")
            if p.name in saved} == saved   # seed 0 not rerun
    assert result["seeds"] == 2 and result["seed_list"] == [0, 1]
    assert "| spotlight (product) | " in resumed.stdout   # the table a person reads first
    modes = ("vanilla", "stale", "spotlight")
    assert result["modes"] == list(modes) and result["target"] == 2.0
    # The planner planned iteration 1 on the time the stale cluster run measured.
    assert result["planner_choices"]["spotlight"][0][0] == 1
    # ... and is timed as that run less its waits for exploration (its plans fit the window).
    assert 0 < result["seconds_per_iteration"]["spotlight"] <= \
        result["seconds_per_iteration"]["stale"]
    for key in ("speedup_vs_vanilla", "iteration_speedup_vs_vanilla"):
        assert set(result[key]) == {"median", "ci90", "per_seed"}, key
    assert result["speedup_vs_sync"] is None and result["staleness_cost"] is None   # no sync
    for mode in modes:   # unreachable target: nobody gets there, each counted at the budget
        assert result["iterations_to_target"][mode] == [None, None]
        assert result["unreached"][mode] == 2
        assert len(result["cost_to_target_usd"][mode]) == 2
        assert [[i for i, _ in c] for c in result["val_curves"][mode]] == [[0, 1, 2]] * 2
        assert result["seconds_per_iteration"][mode] > 0
    for mode in ("vanilla", "stale"):
        assert result["cluster_check"][mode]["curve_matches_harness"] is True
    assert result["iteration_speedup_vs_vanilla"]["per_seed"] == [1.0, 1.0]
    assert result["kendall_tau"]["audits"] <= 2   # iteration 1 of each seed had stale candidates
    assert (tmp_path / "conv.png").stat().st_size > 0
    assert result["overrides"] == {"grpo.lr": 1e-4}
    assert "stale     seed 1 iter   1" in resumed.stdout


def test_bad_config_is_refused_before_any_work(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("grpo:\n  group_sise: 4\n")
    assert main(["demo", "--config", str(path), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "group_sise" in err and "group_size" in err and str(path) in err
    assert not (tmp_path / "r").exists()


def test_missing_base_checkpoint_is_a_clear_error(tmp_path):
    from spotlight.config import load_config
    from spotlight.models.policy import MissingCheckpointError
    from spotlight.models.pretrain import load_base_policy

    config = load_config("configs/digits.yaml", {"pretrain.seed": 12345})
    with pytest.raises(MissingCheckpointError, match="spotlight pretrain"):
        load_base_policy(config)


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "fast"])
def test_run_refuses_a_time_scale_that_is_not_positive(scale, capsys):
    from pipelines.front.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--preempt-trace", "x.csv", "--time-scale", scale])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--time-scale" in err and "must be a number > 0" in err


def test_run_names_a_missing_preemption_trace(tmp_path, capsys):
    from pipelines.front.cli import main

    assert main(["run", "--preempt-trace", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert "nope.csv" in err and "does not exist" in err
