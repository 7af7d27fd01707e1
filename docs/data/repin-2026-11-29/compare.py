"""Run the old Harness or the new InProcessRun on a few scenarios; print JSON per scenario."""
import hashlib, json, os, sys, tempfile
import yaml

which = sys.argv[1]
names = sys.argv[2].split(",") if len(sys.argv) > 2 else None
from tests.pipelines.conftest import TINY_WORLD
from spotlight.config import load_config

def whash(w):
    d = hashlib.sha256()
    for n in sorted(w):
        d.update(n.encode()); d.update(w[n].numpy().tobytes())
    return d.hexdigest()[:16]

SCEN = {
  "vanilla": ("vanilla", {}, None),
  "sync": ("sync", {}, None),
  "spotlight-audit": ("spotlight", {"fidelity": {"audit_every": 1, "audit_prompts": 2, "audit_candidates": 3, "floor": 0.99, "min_iterations": 1}}, None),
  "spotlight-planner": ("spotlight", {"planner": {"enabled": True}}, dict(window_s=2.0, sec_per_sample_step=0.05, spot_slots=2)),
  "nft-explored": ("spotlight", {"objective": {"kind": "nft", "train_on_explored": True}}, None),
}
out = {}
tmp = tempfile.mkdtemp()
os.environ.setdefault("SPOTLIGHT_CACHE", "/tmp/cmp/cache")
for name, (mode, extra, tm) in SCEN.items():
    if names and name not in names: continue
    run = {**TINY_WORLD, **{k: ({**TINY_WORLD.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in extra.items()}, "iterations": 3}
    path = os.path.join(tmp, name + ".yaml"); yaml.safe_dump(run, open(path, "w"))
    cfg = load_config(path)
    if which == "old":
        from pipelines.run.harness import Harness as R, TimeModel
    else:
        from pipelines.run.inprocess import InProcessRun as R
        from spotlight.iteration import TimeModel
    r = R(cfg, mode, time_model=TimeModel(**tm) if tm else None)
    try:
        h = r.run_iterations(3, validate_every=1)
        w = r.store.load_checkpoint(3).weights
    finally:
        r.close()
    out[name] = {"val": [it.val_reward for it in h.iterations], "rollout": [it.rollout_reward for it in h.iterations],
                 "src": [it.source for it in h.iterations], "tau": [it.audit_tau for it in h.iterations],
                 "plan": [it.plan for it in h.iterations], "explored": [it.trained_on_explored for it in h.iterations],
                 "w": whash(w)}
    print(name, json.dumps(out[name]), flush=True)
