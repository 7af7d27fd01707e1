"""A convergence bench summarized again from its saved parts with this checkout's bookkeeping,
optionally with some of its jobs replaced by longer runs of the same job (same mode, seed, base
and settings; only a higher iteration cap), so a seed that had not reached the target within
the bench's cap counts at its measured crossing instead of the cap. Seeds still unreached stay
censored at the bench's own cap. The first validations of a longer run must be the bench job's
bit for bit (the harness is deterministic), which this checks.
Usage: python resummarize.py BENCH.json OUT.json [LONGER.parts ...]"""
import json
import sys
from pathlib import Path

from pipelines.bench.convergence import BENCH_SETTINGS, TASK_CONFIGS
from pipelines.bench.convergence_report import summarize
from pipelines.bench.convergence_table import markdown_table
from pipelines.bench.registry import write_result
from spotlight.config import load_config

FACTS = ("task", "config", "base_val_reward", "base_val_standard_error",
         "standard_error_under_half_the_gain", "target", "seeds_asked", "modes", "iterations",
         "budget", "validation_every", "overrides", "prompts_per_iteration", "candidates",
         "group_size", "product", "models_made_on", "parts")

bench_json, out = Path(sys.argv[1]), Path(sys.argv[2])
bench = json.loads(bench_json.read_text())
saved = {p.stem: json.loads(p.read_text())["result"] for p in Path(bench["parts"]).glob("*.json")}
for folder in sys.argv[3:]:
    for path in Path(folder).glob("*-seed*.json"):
        if path.stem.startswith("cluster-"):
            continue
        longer = json.loads(path.read_text())["result"]
        shorter = saved[path.stem]["val_curve"]
        if longer["val_curve"][:len(shorter)] != shorter:
            sys.exit(f"{path} does not repeat {path.stem}'s first {len(shorter)} validations: "
                     "it is another run, not a longer one")
        saved[path.stem] = longer
        print(f"{path.stem}: {len(shorter) - 1} -> {len(longer['val_curve']) - 1} validations")
facts = {**{k: bench[k] for k in FACTS}, "png": str(out.with_suffix(".png"))}
config = load_config(TASK_CONFIGS[bench["task"]], {**BENCH_SETTINGS, **bench["overrides"]})
result = summarize(saved, facts, bench["seed_list"], config, out.with_suffix(".png"))
result["wall_s"] = bench.get("wall_s")   # the bench's own
write_result(result, str(out))
print(markdown_table(result))
