"""bench convergence with another training objective: its modes run end to end, the cluster
computes what the harness does under that objective, and exploration on top of it is measured
against it alone."""
import json
from pathlib import Path

from pipelines.bench.convergence_time import seconds_per_iteration
from pipelines.observe.run_view import RunView
from tests.pipelines.conftest import run_quick_bench
from tests.pipelines.test_cli import tiny_yaml  # noqa: F401 - the fixture


def test_bench_convergence_quick_with_the_forward_process_objective(tiny_yaml, tmp_path,  # noqa: F811
                                                                    outside_repo):
    args = ["--config", str(tiny_yaml), "--target", "2.0", "--seeds", "1",
            "--modes", "vanilla,nft-vanilla,nft-stale,nft-spotlight", "--product", "nft-spotlight"]
    result, done = run_quick_bench("convergence", args, outside_repo, tmp_path / "conv.json",
                                   timeout=420)
    parts = {p.name for p in Path(result["parts"]).glob("*.json")}
    assert parts == {"vanilla-seed0.json", "nft-vanilla-seed0.json", "nft-stale-seed0.json",
                     "nft-spotlight-seed0.json", "cluster-vanilla-seed0.json",
                     "cluster-nft-vanilla-seed0.json", "cluster-nft-stale-seed0.json"}
    assert result["product"] == "nft-spotlight"
    # The cluster runs trained with the objective their mode names (stored with each run).
    runs = Path(result["parts"]) / "runs"
    kinds = {m: RunView.open(str(runs / f"cluster-{m}-seed0")).config()["objective"]["kind"]
             for m in ("vanilla", "nft-vanilla", "nft-stale")}
    assert kinds == {"vanilla": "flow-grpo", "nft-vanilla": "nft", "nft-stale": "nft"}
    # (The tiny world's rewards are all zero, so its curves cannot tell objectives apart:
    # the stored configs above are the check that each run trained with its own.)
    # The planned mode: the fixed-arm stale run's seconds less its waits for exploration.
    stale_part = Path(result["parts"]) / "cluster-nft-stale-seed0.json"
    stale_run = json.loads(stale_part.read_text())["result"]
    assert len(stale_run["explore_wait_s"]) == len(stale_run["iteration_s"])
    # Each cluster run keeps its gpu path by stage: training on it, exploration beside it.
    assert stale_run["stage_s"]["train"] > 0 and "explore" not in stale_run["stage_s"]
    assert set(result["stage_s"]) == {"vanilla", "nft-vanilla", "nft-stale"}
    assert result["seconds_per_iteration"]["nft-spotlight"] == \
        seconds_per_iteration(stale_run, fitted=True) <= \
        result["seconds_per_iteration"]["nft-stale"]
    assert result["planner_choices"]["nft-spotlight"][0][0] == 1
    by_mode = result["speedup_by_mode"]["nft-spotlight"]
    assert set(by_mode["vs_objective_alone"]) == {"median", "ci90", "per_seed"}
    assert result["speedup_vs_vanilla"] == by_mode["vs_vanilla"]
    assert result["best_baseline"] in ("vanilla", "nft-vanilla")
    assert set(result["kendall_tau_by_objective"]) == {"nft"}
    assert result["kendall_tau"]["audits"] == 0   # no Flow-GRPO stale mode ran
