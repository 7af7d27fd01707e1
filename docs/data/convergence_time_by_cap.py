"""Harness minutes of `bench convergence` (8 seeds, 2 workers) if every job stopped at a cap of
iterations, from the saved parts of a bench: each job's wall time per iteration x its
iterations up to the cap. Usage: python convergence_time_by_cap.py PARTS_FOLDER [MODES]."""
import glob
import json
import sys

folder = sys.argv[1]
modes = (sys.argv[2] if len(sys.argv) > 2 else "vanilla,sync,stale,spotlight").split(",")
jobs = [json.load(open(f))["result"] for f in sorted(glob.glob(f"{folder}/*-seed*.json"))]
jobs = [j for j in jobs if j.get("mode") in modes]
seeds = len({j["seed"] for j in jobs})
for cap in (10, 15, 20, 25, 30):
    seconds = sum(min(len(j["iterations"]), cap) * j["wall_s"] / len(j["iterations"])
                  for j in jobs)
    print(f"cap {cap:2d}: {seconds / seeds * 8 / 2 / 60:5.1f} min of harness jobs "
          f"for 8 seeds on 2 workers ({len(jobs)} jobs, {seeds} seeds)")
