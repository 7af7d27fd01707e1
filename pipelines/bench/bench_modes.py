"""The names of ``bench convergence``'s modes: an optional training objective, then how seeds
are chosen.

``vanilla`` / ``sync`` / ``stale`` / ``spotlight`` / ``spotlight-xR`` / ``rlboost`` train with
Flow-GRPO (the run config's objective). ``OBJECTIVE-MODE`` trains the same way with another
objective: ``nft-vanilla`` is DiffusionNFT's forward-process objective on random seeds (the
strong baseline without exploration), ``nft-spotlight`` the product's stale exploration on top
of it; ``reuse-...`` is the same objective trained on the explored samples themselves
(``objective.train_on_explored``: an iteration with explored seeds has no rollout), measured
against ``nft-vanilla`` (without exploration it is that mode); ``awm-...`` and
``awm-reuse-...`` are the same with Advantage Weighted Matching's objective in place of NFT's
(``awm-reuse-spotlight`` against ``awm-vanilla``); ``reuse-cover-...`` is ``reuse-...`` whose
planner, where 16 candidates fit only some prompts, explores every prompt with 12
(``planner.cover_candidates``); ``fast-...`` is the few-step
Flow-GRPO variant (a two-step SDE window, ODE elsewhere, only the window trained, as
Flow-GRPO-Fast and MixGRPO).
"""
from __future__ import annotations

SEED_MODES = ("vanilla", "sync", "stale", "spotlight", "rlboost")
# What each objective prefix sets on the bench's config (a job's seed set on top of it).
OBJECTIVE_SETTINGS: dict[str, dict] = {
    "nft": {"objective.kind": "nft"},
    "reuse": {"objective.kind": "nft", "objective.train_on_explored": True},
    "awm": {"objective.kind": "awm"},
    "awm-reuse": {"objective.kind": "awm", "objective.train_on_explored": True},
    "reuse-cover": {"objective.kind": "nft", "objective.train_on_explored": True,
                    "planner.cover_candidates": 12},
    "fast": {"sampler.sde_window_size": 2},
}
# An objective whose runs without exploration are another's: its baseline is that one's.
SAME_WITHOUT_EXPLORATION = {"reuse": "nft", "awm-reuse": "awm", "reuse-cover": "nft"}
# An objective whose fixed-arm stale runs are another's (they explore without the planner, so a
# planner setting changes nothing in them): its planned modes plan on that one's cluster run.
SAME_FIXED_ARM = {"reuse-cover": "reuse"}


def split_mode(mode: str) -> tuple[str | None, str]:
    """(objective prefix or None, the seed mode): 'nft-spotlight-x2' -> ('nft', 'spotlight-x2'),
    'awm-reuse-spotlight' -> ('awm-reuse', 'spotlight'): the longest prefix that names one."""
    for prefix in sorted(OBJECTIVE_SETTINGS, key=len, reverse=True):
        if mode.startswith(prefix + "-"):
            return prefix, mode[len(prefix) + 1:]
    return None, mode


def objective_settings(mode: str) -> dict:
    """The config values ``mode``'s objective prefix sets ({} for Flow-GRPO as configured)."""
    objective, _ = split_mode(mode)
    return dict(OBJECTIVE_SETTINGS.get(objective, {}))


def with_objective(objective: str | None, seed_mode: str) -> str:
    return seed_mode if objective is None else f"{objective}-{seed_mode}"


def planned_ratio(mode: str) -> int | None:
    """The spot:gpu capacity ratio of a planned mode ('spotlight' = 1, 'spotlight-x4' = 4, the
    same behind an objective prefix): stale exploration with the planner, on that many spot
    slots per gpu worker's; None for the others ('stale' is the same exploration at the fixed
    arm, without the planner)."""
    _, seeds = split_mode(mode)
    if seeds == "spotlight":
        return 1
    if seeds.startswith("spotlight-x") and seeds[len("spotlight-x"):].isdigit():
        return max(1, int(seeds[len("spotlight-x"):]))
    return None


def seed_mode(mode: str) -> str:
    return split_mode(mode)[1]


def session_mode(mode: str) -> str:
    """The pipeline mode a bench mode runs: ``stale`` and the planned modes are Spotlight's
    stale exploration (the bench's names tell the fixed arm from the planner)."""
    seeds = seed_mode(mode)
    return "spotlight" if seeds == "stale" or planned_ratio(mode) else seeds


def stale_of(mode: str) -> str:
    """The fixed-arm stale mode of ``mode``'s objective: where a planned mode's time comes from."""
    objective = split_mode(mode)[0]
    return with_objective(SAME_FIXED_ARM.get(objective, objective), "stale")


def timing_modes(modes) -> set[str]:
    """The modes whose cluster runs a bench of ``modes`` times: every mode but the planned
    ones, and the stale mode each planned one plans on (listed or not)."""
    return ({m for m in modes if planned_ratio(m) is None}
            | {stale_of(m) for m in modes if planned_ratio(m) is not None})


def baseline_of(mode: str) -> str:
    """The same objective without exploration: what exploration on top of it is measured against."""
    objective = split_mode(mode)[0]
    return with_objective(SAME_WITHOUT_EXPLORATION.get(objective, objective), "vanilla")


def known_mode(mode: str) -> bool:
    return seed_mode(mode) in SEED_MODES or planned_ratio(mode) is not None
