"""The run modes, and what each one means. A mode is named in configs and records by its
string; the code asks the :class:`Mode` what it does instead of comparing names."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    explores: bool          # seeds are chosen by scoring candidates (else random seeds)
    stale: bool             # with the previous weights, on spot workers, while training runs
    rollout_on_spot: bool   # the rollout is pulled by gpu and spot workers by default
    summary: str
    hybrid_rollout: bool = False   # the mode is that rollout: its placement must include spot

    @property
    def explore_on(self) -> tuple[str, ...]:
        """Where exploration runs by default: spot off the critical path, else gpu workers."""
        return ("spot",) if self.stale else ("gpu",)

    @property
    def rollout_on(self) -> tuple[str, ...]:
        return ("gpu", "spot") if self.rollout_on_spot else ("gpu",)

    @property
    def needs_spot(self) -> bool:
        """Whether the mode cannot do its work without spot workers."""
        return self.stale

    def __str__(self) -> str:
        return self.name


SPOTLIGHT = Mode("spotlight", explores=True, stale=True, rollout_on_spot=True,
                 summary="stale-weight exploration on spot workers during training")
SYNC = Mode("sync", explores=True, stale=False, rollout_on_spot=False,
            summary="exploration on gpu workers before the rollout")
VANILLA = Mode("vanilla", explores=False, stale=False, rollout_on_spot=False,
               summary="random seeds")
RLBOOST = Mode("rlboost", explores=False, stale=False, rollout_on_spot=True,
               summary="random seeds, rollouts pulled by gpu and spot workers: RLBoost's hybrid "
                       "rollout, the paper's baseline", hybrid_rollout=True)

MODES: dict[str, Mode] = {m.name: m for m in (SPOTLIGHT, SYNC, VANILLA, RLBOOST)}
MODE_NAMES: tuple[str, ...] = tuple(MODES)


def mode_of(name: "str | Mode") -> Mode:
    """The mode called ``name``; a clear error naming the choices otherwise."""
    if isinstance(name, Mode):
        return name
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"mode {name!r} is not one of {', '.join(MODE_NAMES)}") from None
