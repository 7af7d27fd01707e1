"""Does validating averaged weights lift or steady GenEval's validation curve?

Trains the shipped GenEval setting (learning-val4.yaml: the same run as that bench) for 50
iterations and, at the listed iterations, validates the live weights, the mean of the last 5
and of the last 10 iterations' weights, and an EMA (0.8) of every iteration's weights.
Run from this folder: ``python averaged_weights.py`` (writes averaged-weights.json).
"""
import collections
import json

from pipelines.run.inprocess import InProcessRun
from spotlight.config import load_config
from spotlight.models.base import base_policy
from spotlight.rewards import check_rewards
from spotlight.rl.validation import validate

POINTS = (20, 30, 40, 45, 50)
EMA_DECAY = 0.8


def mean_of(states):
    return {k: sum(s[k] for s in states) / len(states) if states[0][k].is_floating_point()
            else states[-1][k] for k in states[0]}


def main():
    cfg = load_config("learning-val4.yaml", {"pretrain.time_budget_s": 86400.0})
    run = InProcessRun(cfg, "vanilla")   # the iteration program, in this process
    probe = base_policy(cfg, progress=False)
    history = collections.deque(maxlen=10)
    ema = {k: v.detach().clone() for k, v in run.store.load_checkpoint(0).weights.items()}

    def reward_of(state):
        probe.load_state_dict(state)
        return validate(probe, run.val_prompts, run.reward_fn, check_rewards, cfg).mean_reward

    rows = []
    for k in range(max(POINTS)):
        run.iteration(k, explore_next=False, validate=False)
        state = dict(run.store.load_checkpoint(k + 1).weights)
        history.append(state)
        for key, v in state.items():
            if v.is_floating_point():
                ema[key].mul_(EMA_DECAY).add_(v, alpha=1 - EMA_DECAY)
        if k + 1 in POINTS:
            rows.append({"iteration": k + 1, "live": reward_of(state),
                         "mean5": reward_of(mean_of(list(history)[-5:])),
                         "mean10": reward_of(mean_of(list(history))), "ema0.8": reward_of(ema)})
            print(rows[-1], flush=True)
            json.dump(rows, open("averaged-weights.json", "w"), indent=1)


if __name__ == "__main__":
    main()
