"""Seconds per iteration on the embedded cluster (1 gpu + 1 spot), as bench convergence's cluster
check measures them: nft-stale against reuse-stale, seed 0, a fixed number of iterations."""
import json
import os
import shutil
import sys

from pipelines.bench.bench_modes import objective_settings
from pipelines.bench.convergence import BENCH_SETTINGS, run_until
from pipelines.bench.learning import TASK_CONFIGS
from spotlight.config import load_config


def main():
    out, modes, iterations = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    results = json.load(open(out)) if os.path.exists(out) else {}
    for mode in modes:
        if mode in results:
            continue
        cfg = load_config(TASK_CONFIGS["ocr"], BENCH_SETTINGS).with_values(
            {"seed": 0, **objective_settings(mode)})
        url = f"/work/bench/probe/runs/{mode}"
        shutil.rmtree(url, ignore_errors=True)
        got = run_until(cfg, mode, url, None, iterations)
        results[mode] = {"iteration_s": got["iteration_s"], "wall_s": got["wall_s"],
                         "val_curve": got["val_curve"]}
        json.dump(results, open(out, "w"))
        print(mode, [round(s, 1) for s in got["iteration_s"]], flush=True)


if __name__ == "__main__":
    main()
