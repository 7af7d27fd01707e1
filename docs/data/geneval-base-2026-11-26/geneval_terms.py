"""Per-tag, per-term breakdown of the GenEval base (and of world-rendered canvases = ceiling).

Run from the project root: python geneval_terms.py [KEY=VALUE ...] (config overrides).
"""
import sys
from collections import defaultdict

import numpy as np
import torch

from spotlight.config import load_config, shipped_config
from spotlight.models.base import base_policy
from spotlight.models.prompts import world_prompts
from spotlight.models.world import render
from spotlight.rewards import build_reward, check_rewards
from spotlight.rewards.detect import detect_batch
from spotlight.rewards.geneval import clause_terms
from spotlight.rl.validation import validate

over = {"pretrain.time_budget_s": 86400.0, "validation.seeds_per_prompt": 4}
for kv in sys.argv[1:]:
    k, v = kv.split("="); over[k] = type(eval(v))(eval(v))
cfg = load_config(shipped_config("digits-geneval.yaml"), over)
torch.set_num_threads(1)
prompts = world_prompts(cfg, "val")
reward = build_reward(cfg.reward)
def breakdown(images, flat, label):
    found = detect_batch(images, reward.recognizer, reward.settings)
    acc = defaultdict(lambda: defaultdict(list))
    for d, p in zip(found, flat):
        terms = clause_terms(d, p)
        acc[p.tag]["mean"].append(np.mean(terms)); acc[p.tag]["strict"].append(float(min(terms) >= 1))
        i = 0
        for c in p.include:
            acc[p.tag]["count"].append(terms[i]); i += 1
            if c.color is not None: acc[p.tag]["color"].append(terms[i]); i += 1
            if c.position is not None: acc[p.tag]["pos"].append(terms[i]); i += 1
    print(label)
    for tag, t in sorted(acc.items()):
        print(f"  {tag:11s} n={len(t['mean']):3d} " + " ".join(f"{k}={np.mean(v):.3f}" for k, v in t.items()))
    allm = [x for t in acc.values() for x in t["mean"]]
    print(f"  ALL mean={np.mean(allm):.3f}")
rng = np.random.default_rng(0)
flat = [p for p in prompts for _ in range(4)]
truth = np.stack([render(p, cfg.world.canvas_height, cfg.world.canvas_width, rng, cfg.world.glyphs_per_class) for p in flat])
breakdown(truth.astype(np.float32), flat, "world-rendered (ceiling)")
res = validate(base_policy(cfg, progress=False), prompts, reward, check_rewards, cfg)
breakdown(res.images, [p for p in res.prompts for _ in range(4)], f"base val={res.mean_reward:.3f}")
# The picture: the world's canvases (top) over the base's samples (bottom), one seed per prompt.
import PIL.Image as I


def grid(imgs, n=32):
    imgs = np.clip(imgs[:n], 0, 1)
    rows = [np.concatenate(list(imgs[i:i+8].transpose(0, 2, 3, 1)), axis=1) for i in range(0, n, 8)]
    return (np.concatenate(rows, axis=0) * 255).astype(np.uint8)
g = np.concatenate([grid(truth[::4]), grid(res.images[::4])], axis=0)
I.fromarray(g).resize((g.shape[1]*4, g.shape[0]*4), I.NEAREST).save("geneval_base.png")
print([p.text for p in prompts[:32]])
