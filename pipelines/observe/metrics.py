"""The curves a tracker draws: one iteration's records -> {metric name: value}.

Pure functions of what the run store keeps for an iteration (its result row, cost ledger, task
timeline and batch of run events), so a tracker that logs a live run and one that catches up
on a resumed run log the same values. Step k is iteration k (θ_k -> θ_k+1); a validation of
weights version v is logged at step v (the base model at step 0), as flow_grpo logs an
evaluation at the global step of the weights it evaluates.

Names follow flow_grpo's where they mean the same:

=====================  ========================================================================
``reward_avg``         mean rollout reward (``reward_<name>`` too, per reward: e.g. ``reward_ocr``)
``reward_std_mean``    mean over prompts of the group's reward std (``reward_std_<name>`` too)
``zero_std_ratio``     share of groups whose rewards did not spread (dropped from training)
``loss``               the optimised loss (PPO-clip + β·KL); ``policy_loss`` without the KL term
``kl_loss``            KL to the frozen reference
``approx_kl``          PPO's approximate KL between the trained and the rollout policy
``clipfrac``           share of PPO ratios outside the clip range
``lr``                 the step's learning rate
``eval_reward_avg``    mean validation reward (``eval_reward_<name>`` too); ``eval_images``
=====================  ========================================================================

Spotlight's own, grouped by prefix: ``time/<stage>_s`` (first start to last end of the stage's
tasks in the iteration; ``time/iteration_s``), ``exploration/*`` and ``planner/*`` (the
exploration budget, the planner's arm N candidates x M steps, what was explored),
``fidelity/*`` (the audit's τ, τ over the selected seeds, whether the stale ranking is
trusted), ``spot/*`` (preemptions and lost denoising steps by class: hard, graceful) and
``cost/*`` (USD this iteration and so far, per worker class: ``on_demand`` = the gpu workers,
``spot`` = the spot workers). A value the iteration does not have (no plan, no audit) is left
out rather than logged as 0.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from spotlight.cost import CostLedger

# Always logged for an iteration (``reward_<name>`` and the others per reward come with them).
ALWAYS = ("reward_avg", "reward_std_mean", "zero_std_ratio", "loss", "policy_loss", "kl_loss",
          "clipfrac", "time/iteration_s", "exploration/explored", "exploration/planned",
          "exploration/filled", "fidelity/trusting", "spot/preemptions_hard",
          "spot/preemptions_graceful", "spot/gave_up", "spot/lost_steps_hard",
          "spot/lost_steps_graceful", "cost/iteration_usd", "cost/total_usd", "cost/spot_usd",
          "cost/on_demand_usd")
# The stages whose span is drawn (``time/<stage>_s``), when the iteration ran them.
STAGES = ("rollout", "reward", "advantages", "train", "checkpoint", "explore", "explore-sync",
          "audit", "validation")


def iteration_metrics(result: Mapping[str, Any], *, reward: str, groups: int, beta_kl: float,
                      tasks: list[dict], events: list[dict], ledger: Mapping[str, Any],
                      prices: Mapping[str, float]) -> dict[str, float]:
    """Every metric of one iteration, from its stored result row (``IterationResult``),
    task timeline, batch of run events and cost ledger; ``prices``: USD per GPU-hour by
    worker class. Values are floats; absent ones are left out."""
    out = {**training_metrics(result, reward=reward, groups=groups, beta_kl=beta_kl),
           **stage_seconds(tasks, result),
           **exploration_metrics(result),
           **preemption_metrics(events, tasks),
           **cost_metrics(result, ledger, prices)}
    return {k: float(v) for k, v in out.items() if v is not None}


def training_metrics(result: Mapping[str, Any], *, reward: str, groups: int,
                     beta_kl: float) -> dict[str, float | None]:
    kl = result["kl_to_reference"]
    out = {"reward_avg": result["reward_mean"], f"reward_{reward}": result["reward_mean"],
           "reward_std_mean": result["group_reward_std"],
           f"reward_std_{reward}": result["group_reward_std"],
           "zero_std_ratio": result["zero_std_groups"] / max(groups, 1),
           "loss": result["loss"], "policy_loss": result["loss"] - beta_kl * kl, "kl_loss": kl,
           "clipfrac": result["clip_fraction"], "approx_kl": result.get("approx_kl"),
           "lr": result.get("learning_rate")}
    return out


def validation_metrics(mean_reward: float, *, reward: str) -> dict[str, float]:
    return {"eval_reward_avg": float(mean_reward), f"eval_reward_{reward}": float(mean_reward)}


def stage_seconds(tasks: list[dict], result: Mapping[str, Any]) -> dict[str, float]:
    """Wall seconds of each stage in the iteration: its first task's start to its last end
    (tasks of a stage overlap on several workers), and of the whole iteration."""
    out = {"time/iteration_s": result["end"] - result["start"]}
    for stage in STAGES:
        mine = [t for t in tasks if t.get("stage") == stage and "start" in t and "end" in t]
        if mine:
            out[f"time/{stage}_s"] = max(t["end"] for t in mine) - min(t["start"] for t in mine)
    return out


def exploration_metrics(result: Mapping[str, Any]) -> dict[str, float | None]:
    overrun = result.get("plan_overrun")
    return {"exploration/explored": result["explored"],
            "exploration/planned": result["planned"], "exploration/filled": result["filled"],
            "exploration/budget_s": result.get("plan_budget_s"),
            "exploration/predicted_s": result.get("plan_predicted_s"),
            "exploration/overrun": None if overrun is None else float(overrun),
            "planner/candidates": result.get("plan_candidates"),
            "planner/steps": result.get("plan_steps"),
            "fidelity/audit_tau": result.get("audit_tau"),
            "fidelity/kendall_tau": result.get("kendall_tau"),
            "fidelity/trusting": float(result.get("fidelity_state", "trusting") == "trusting")}


def preemption_metrics(events: list[dict], tasks: list[dict]) -> dict[str, float]:
    """Preemptions of the iteration's requests by class (hard: the worker vanished; graceful:
    it handed its request back on a notice), the pools that gave up, and the denoising steps
    lost by class. A graceful hand-back loses the steps it computed past its last commit
    (exact); a hard loss is estimated as the time from the request's last commit (or its
    assignment, if later) to when the loss was noticed, in the iteration's median step time
    -- an upper bound, since the worker died before it was noticed."""
    summaries = [e.get("summary") or {} for e in events if e.get("kind") == "preemptions"]
    moves = sorted((e for e in events if e.get("kind") == "request"),
                   key=lambda e: e.get("at", 0.0))
    graceful = sum(max(m["computed_step"] - m["step"], 0) for m in moves
                   if m.get("what") == "handed_back" and m.get("computed_step") is not None
                   and m.get("step") is not None)
    return {"spot/preemptions_hard": sum(s.get("preemptions_hard", 0) for s in summaries),
            "spot/preemptions_graceful": sum(s.get("preemptions_graceful", 0)
                                             for s in summaries),
            "spot/gave_up": sum(1 for s in summaries if s.get("gave_up")),
            "spot/lost_steps_hard": _hard_lost_steps(moves, step_seconds(tasks)),
            "spot/lost_steps_graceful": graceful}


def _hard_lost_steps(moves: list[dict], step_s: float | None) -> float:
    assigned: dict[tuple, float] = {}
    lost = 0.0
    for m in moves:
        key = (m.get("stage"), m.get("request"))
        if m.get("what") == "assigned":
            assigned[key] = m.get("at", 0.0)
        elif m.get("what") == "requeued" and m.get("hard") and m.get("committed_at") is not None \
                and step_s:
            since = max(m["committed_at"], assigned.get(key, m["committed_at"]))
            lost += max(m.get("at", since) - since, 0.0) / step_s
    return lost


def step_seconds(tasks: list[dict]) -> float | None:
    """Median compute time of one denoising step of the iteration's streamed requests (first
    to last committed step: loading, decoding and scoring left out); None without any."""
    per = [(t["last_step_at"] - t["first_step_at"]) / (t["steps"] - t["first_step"])
           for t in tasks if t.get("first_step_at") and t.get("last_step_at")
           and t.get("steps", 0) > t.get("first_step", 0)]
    return float(np.median(per)) if per else None


def cost_metrics(result: Mapping[str, Any], ledger: Mapping[str, Any],
                 prices: Mapping[str, float]) -> dict[str, float]:
    """USD of the iteration and of the run so far, the latter per worker class."""
    so_far = CostLedger.from_dict(ledger).total(result["end"], prices)
    return {"cost/iteration_usd": result["cost_usd"], "cost/total_usd": result["cost_total_usd"],
            "cost/spot_usd": so_far.get("spot", 0.0),
            "cost/on_demand_usd": so_far.get("gpu", 0.0)}
