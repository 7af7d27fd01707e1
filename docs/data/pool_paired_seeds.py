"""Pool the paired seeds of several `bench convergence` JSONs into one median and 90% bootstrap
interval per speed-up. Each bench pairs its modes within a seed (same base, same target rule,
same machine's time model), so a seed's ratios stand on their own; pooling only resamples more
seeds. The benches must have run the same modes and product, and no seed twice.
Usage: python pool_paired_seeds.py BENCH.json [BENCH.json ...]"""
import json
import sys

from spotlight.evidence import bootstrap_median

benches = [json.load(open(path)) for path in sys.argv[1:]]
seeds = [s for b in benches for s in b["seed_list"]]
if len(seeds) != len(set(seeds)):
    sys.exit(f"a seed appears in two benches: {sorted(seeds)}; pool benches over other seeds")
if len({(tuple(b["modes"]), b["product"]) for b in benches}) != 1:
    sys.exit("the benches ran other modes or another product; pool only the same comparison")
first = benches[0]


def pooled(mode: str, versus: str) -> dict | None:
    per_seed = [x for b in benches for x in ((b["speedup_by_mode"].get(mode) or {})
                                             .get(versus) or {}).get("per_seed", [])]
    return bootstrap_median(per_seed) if per_seed else None


def shown(figure: dict | None) -> str:
    if figure is None:
        return "-"
    lo, hi = figure["ci90"]
    return f"{figure['median']:.2f} [{lo:.2f}, {hi:.2f}] over {len(figure['per_seed'])}"


print(f"{len(seeds)} seeds; bases " + ", ".join(f"{b['base_val_reward']:.3f} (seeds "
      f"{b['seed_list'][0]}-{b['seed_list'][-1]})" for b in benches))
for mode in first["modes"]:
    if mode == "vanilla":
        continue
    print(f"{mode:22s} vs vanilla {shown(pooled(mode, 'vs_vanilla')):30s} "
          f"iterations vs vanilla {shown(pooled(mode, 'iterations_vs_vanilla')):30s} "
          f"vs its objective alone {shown(pooled(mode, 'vs_objective_alone'))}")
for mode in first["modes"]:
    unreached = sum(b["unreached"][mode] for b in benches)
    print(f"{mode:22s} unreached in {unreached} of {len(seeds)} seeds")
