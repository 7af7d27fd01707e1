"""The exploration planner: how many candidates (N) over how many steps (M) fit in training time.

A UCB bandit over the (N, M) settings. The budget is the predicted training time of the
current iteration (the mean of the last few measured) times ``budget_fraction``: exploration
runs on spot slots while training runs, so a plan whose predicted wall time (spot-seconds over
slots) exceeds it would make the iteration wait or throw work away. The payoff of a setting is
what GRPO actually gets from it — the reward spread of the selected groups at rollout over the
spread of random seeds, minus one — per spot-second: billed (the window times the slots,
paid whether exploration computes or idles) or busy (what exploration computed), by
``payoff``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from spotlight.config import PlannerConfig, SamplerConfig, faithful_replay


def predict_train_seconds(history: list[float], window: int) -> float | None:
    """Mean of the last ``window`` measured training times; None before any was measured."""
    recent = [h for h in history[-window:] if h > 0]
    return sum(recent) / len(recent) if recent else None


def exploration_window_s(rollout_task: dict | None, train_task: dict | None,
                         window: str) -> float | None:
    """Seconds stale exploration had in one measured iteration: the training task's duration
    (``window == "train"``) or rollout start to training end (``"iteration"``); None when a
    needed task was not measured (a resumed stage)."""
    if not train_task:
        return None
    if window == "train":
        return train_task["end"] - train_task["start"]
    if window != "iteration":
        raise ValueError(f"exploration window {window!r} is not 'iteration' or 'train'")
    return None if not rollout_task else train_task["end"] - rollout_task["start"]


def plan_cost(prompts: int, candidates: int, steps: int, sec_per_sample_step: float) -> float:
    """Spot-seconds to explore ``candidates`` seeds of each prompt over ``steps`` steps."""
    return prompts * candidates * steps * sec_per_sample_step


def spread_gain(selected_std: float, random_std: float) -> float:
    """How much more spread the selected groups had than random ones (1 = no gain)."""
    return selected_std / random_std if random_std > 1e-9 else 1.0


@dataclass(frozen=True)
class Plan:
    iteration: int
    candidates: int             # N per prompt; 0 = no exploration this iteration
    steps: int                  # M denoising steps per replay
    prompts: int                # prompts explored (the first ones); the others get random seeds
    predicted_s: float | None   # predicted wall seconds on the available spot slots
    budget_s: float | None
    arm: int | None
    reason: str
    slots: int = 0              # spot slots alive when it was planned


def iteration_wait_s(plan: Plan, prompts: int, budget: float, replaced_rollout_s: float) -> float:
    """What ``plan`` adds to an iteration whose explored samples replace the rollout: its
    exploration's overrun past the budget, plus the rollout of the prompts it leaves."""
    overrun = max(0.0, (plan.predicted_s or 0.0) - budget)
    return overrun + replaced_rollout_s * (prompts - plan.prompts) / prompts


class ExplorationPlanner:
    """UCB over (N, M) arms restricted to those that fit the budget; deterministic."""

    def __init__(self, config: PlannerConfig, sampler: SamplerConfig | None = None) -> None:
        self.config = config
        # With ``sampler``, M arms that would not replay the rollout's own random process (they
        # coarsen the whole grid; config validation warned about them) are left out.
        steps = [m for m in config.steps if sampler is None or faithful_replay(sampler, m)]
        self.arms = sorted({(n, m) for n in config.candidates for m in steps})
        self.pulls = [0] * len(self.arms)
        self.payoff_sum = [0.0] * len(self.arms)
        self.best_raw = 0.0      # running max of raw payoffs: payoffs are normalised by it so
                                 # gamma's bonus is on the same scale whatever the hardware
        self.events: list[dict] = []

    def _steps(self, arm: int, rollout_steps: int) -> int:
        """An arm's replay steps: 0 and anything past the rollout's own count mean the rollout's
        steps (a replay longer than the rollout would cost more and rank no better)."""
        m = self.arms[arm][1]
        return min(m, rollout_steps) if m else rollout_steps

    def _mean(self, arm: int) -> float:
        return self.payoff_sum[arm] / self.pulls[arm] / max(self.best_raw, 1e-12)

    def plan(self, iteration: int, prompts: int, group_size: int, spot_slots: int,
             train_history_s: list[float], sec_per_sample_step: float | None,
             rollout_steps: int, replaced_rollout_s: float | None = None) -> Plan:
        """The setting to explore ``iteration`` with. ``replaced_rollout_s``: exploration of
        every prompt replaces a rollout that takes this long (``objective.train_on_explored``)."""
        budget_train = predict_train_seconds(train_history_s, self.config.train_time_window)
        budget = None if budget_train is None else budget_train * self.config.budget_fraction
        # N <= G keeps every candidate: no selection, so no gain over random seeds.
        useful = [a for a in range(len(self.arms)) if self.arms[a][0] > group_size] or \
            list(range(len(self.arms)))
        cheapest = min(useful, key=lambda a: (self.arms[a][0] * self._steps(a, rollout_steps), a))

        def wall(n: int, m: int) -> float | None:
            if sec_per_sample_step is None:
                return None
            return plan_cost(prompts, n, m, sec_per_sample_step) / spot_slots

        if spot_slots <= 0:
            plan = Plan(iteration, 0, rollout_steps, 0, None, budget, None,
                        "no spot slots: exploration skipped, random seeds")
        elif budget is None or sec_per_sample_step is None:
            n, m = self.arms[cheapest][0], self._steps(cheapest, rollout_steps)
            plan = Plan(iteration, n, m, prompts, wall(n, m), budget, cheapest,
                        "cold start: cheapest setting until time is measured")
        else:
            fits = [a for a in useful
                    if wall(self.arms[a][0], self._steps(a, rollout_steps)) <= budget]
            if self.config.payoff == "billed" and self.config.prune_dominated:
                fits = self._undominated(fits, rollout_steps)
            if fits:
                arm = self._choose(fits)
                n, m = self.arms[arm][0], self._steps(arm, rollout_steps)
                plan = Plan(iteration, n, m, prompts, wall(n, m), budget, arm,
                            "untried setting" if self.pulls[arm] == 0 else "ucb")
            else:
                steps = min(self._steps(a, rollout_steps) for a in useful)
                plan = self._shrink(iteration, prompts, self.arms[cheapest][0], budget, wall,
                                    steps)
                if replaced_rollout_s is not None:
                    plan = self._sooner_on_every_prompt(plan, prompts, cheapest, rollout_steps,
                                                        steps, budget, wall, replaced_rollout_s)
        plan = replace(plan, slots=spot_slots)
        self.events.append({"kind": "plan", **asdict(plan)})
        return plan

    def _undominated(self, fits: list[int], rollout_steps: int) -> list[int]:
        """The fitting arms no other fitting arm dominates -- at least as many candidates and
        replay steps (of two alike, the first stays). Billed spot time costs the same whatever
        runs in it, and the spread grows with both, so a dominated arm is not worth a try."""
        key = {a: (self.arms[a][0], self._steps(a, rollout_steps)) for a in fits}

        def dominated(a: int) -> bool:
            return any(b != a and key[b][0] >= key[a][0] and key[b][1] >= key[a][1]
                       and (key[b] != key[a] or b < a) for b in fits)
        return [a for a in fits if not dominated(a)]

    def _choose(self, fits: list[int]) -> int:
        untried = [a for a in fits if self.pulls[a] == 0]
        if untried:   # cheapest untried first: arms are sorted by (N, M)
            return untried[0]
        total = sum(self.pulls[a] for a in fits)
        scores = [self._mean(a) + self.config.gamma * math.sqrt(math.log(total + 1) / self.pulls[a])
                  for a in fits]
        return fits[max(range(len(fits)), key=lambda i: (scores[i], -i))]

    def _sooner_on_every_prompt(self, shrunk: Plan, prompts: int, cheapest: int,
                                rollout_steps: int, steps: int, budget: float, wall,
                                replaced_rollout_s: float) -> Plan:
        """Where explored samples replace the rollout and no setting fits every prompt: the
        cheapest arm on every prompt, then ``planner.cover_candidates`` (not a bandit arm: what
        the window allows), each taken over the plan so far (first ``shrunk``) if the iteration
        waits less for it (:func:`iteration_wait_s`)."""
        settings = [(self.arms[cheapest][0], self._steps(cheapest, rollout_steps), cheapest)]
        if self.config.cover_candidates:
            settings.append((self.config.cover_candidates, steps, None))
        plan = shrunk
        for n, m, arm in settings:
            seconds = wall(n, m)
            waited = iteration_wait_s(plan, prompts, budget, replaced_rollout_s)
            if max(0.0, seconds - budget) >= waited:
                continue
            left = (f" (the rollout of the {prompts - plan.prompts} prompts it leaves)"
                    if plan.prompts < prompts else "")
            plan = Plan(plan.iteration, n, m, prompts, seconds, budget, arm,
                        f"{n} candidates on every prompt ({seconds:.2f} s of a {budget:.2f} s "
                        f"budget): sooner than the {waited:.2f} s that {plan.candidates} "
                        f"candidates on {plan.prompts} prompts would make the iteration "
                        f"wait{left}")
        return plan

    def _shrink(self, iteration: int, prompts: int, candidates: int, budget: float, wall,
                steps: int) -> Plan:
        """No setting fits every prompt: the smallest useful N on as many prompts as fit (the
        rest get random seeds), or nothing when not even one prompt fits."""
        per_prompt = wall(candidates, steps) / prompts
        fit = int(budget // per_prompt) if per_prompt > 0 else prompts
        if fit < 1:
            return Plan(iteration, 0, steps, 0, None, budget, None,
                        f"over budget: one prompt's {candidates} candidates x {steps} steps "
                        f"exceed {budget:.2f} s; exploration skipped, random seeds")
        fit = min(fit, prompts)
        return Plan(iteration, candidates, steps, fit, per_prompt * fit, budget, None,
                    f"over budget: {candidates} candidates on {fit} of {prompts} prompts")

    def record(self, plan: Plan, actual_s: float, selected_std: float, random_std: float,
               billed_s: float | None = None) -> None:
        """Pay the plan's arm: the spread gained over random seeds per spot-second.

        The spot-seconds are those billed for the exploration window (``billed_s``; payoff
        ``billed``) or those exploration computed (``actual_s``; payoff ``busy``). Billed time
        is the same whichever setting ran, so under it the best spread that fits wins; busy
        time favours cheap settings and leaves paid-for spot time idle. The gain counts from 1
        (no better than random = no payoff), or every setting's payoff would be dominated by
        its cost and the cheapest would always win.
        """
        spent = billed_s if self.config.payoff == "billed" and billed_s else actual_s
        raw = (spread_gain(selected_std, random_std) - 1.0) / max(spent, 1e-6)
        self.events.append({"kind": "outcome", "iteration": plan.iteration, "arm": plan.arm,
                            "predicted_s": plan.predicted_s, "actual_s": actual_s,
                            "billed_s": billed_s,
                            "selected_std": selected_std, "random_std": random_std,
                            "payoff": raw})
        if plan.arm is None:
            return
        self.best_raw = max(self.best_raw, abs(raw))
        self.pulls[plan.arm] += 1
        self.payoff_sum[plan.arm] += raw

    def to_dict(self) -> dict:
        return {"arms": [list(a) for a in self.arms], "pulls": self.pulls,
                "payoff_sum": self.payoff_sum, "best_raw": self.best_raw,
                "events": self.events[-200:]}

    @classmethod
    def from_dict(cls, config: PlannerConfig, data: dict,
                  sampler: SamplerConfig | None = None) -> "ExplorationPlanner":
        planner = cls(config, sampler)
        if [list(a) for a in planner.arms] != data["arms"]:
            raise ValueError(f"the recorded planner arms {data['arms']} differ from the config's "
                             f"{planner.arms}; resume with the run's own config")
        planner.pulls, planner.payoff_sum = list(data["pulls"]), list(data["payoff_sum"])
        planner.best_raw, planner.events = data["best_raw"], list(data["events"])
        return planner
