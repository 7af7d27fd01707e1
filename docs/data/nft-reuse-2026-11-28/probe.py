"""A harness probe (not a bench): MODES on the shipped OCR config, 15 iterations, validation every
5, from the cached base; run from the repository root:
    python docs/data/nft-reuse-2026-11-28/probe.py OUT.json 0,1 nft-vanilla,nft-stale,reuse-stale 0.23958333333333334
"""
import json
import sys
import time

from pipelines.bench.bench_modes import objective_settings, session_mode
from pipelines.bench.convergence import BENCH_SETTINGS
from pipelines.bench.learning import TASK_CONFIGS
from pipelines.run.inprocess import InProcessRun
from spotlight.config import load_config

out = sys.argv[1]
seeds = [int(s) for s in sys.argv[2].split(",")]
modes = sys.argv[3].split(",")
base = float(sys.argv[4])
results = json.load(open(out)) if __import__("os").path.exists(out) else {}
for seed in seeds:
    for mode in modes:
        key = f"{mode}-seed{seed}"
        if key in results:
            continue
        cfg = load_config(TASK_CONFIGS["ocr"], BENCH_SETTINGS).with_values(
            {"seed": seed, **objective_settings(mode)})
        t = time.perf_counter()
        h = InProcessRun(cfg, session_mode(mode), base_val_reward=base)
        try:
            run = h.run_iterations(15, 5)
        finally:
            h.close()
        results[key] = {"curve": run.val_curve(), "wall_s": time.perf_counter() - t,
                        "sources": [it.source for it in run.iterations],
                        "group_std": [it.group_std for it in run.iterations]}
        print(key, results[key]["curve"], round(results[key]["wall_s"]), flush=True)
        json.dump(results, open(out, "w"))
