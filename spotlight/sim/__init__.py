"""A discrete-event simulator of time and cost to target for Spotlight and its baselines.

Pure Python on a simulated clock (no Dask, no processes, no sleeping): on-demand GPUs, spot GPUs
whose availability follows a real trace, preemptions with or without notice, weight transfer
to newcomers and SP groups that regroup. The project's own pull dispatcher
(:class:`~spotlight.scheduling.dispatch.Dispatcher`) and exploration planner
(:class:`~spotlight.exploration.planner.ExplorationPlanner`) make the decisions.

>>> from spotlight.sim import load_sim_config, simulate
>>> result = simulate(load_sim_config("configs/sim/qwen-image-512.yaml"))  # doctest: +SKIP
>>> result["speedup_vs_ondemand"]                                          # doctest: +SKIP
"""
from spotlight.sim.config import SimConfig, load_sim_config
from spotlight.sim.report import simulate
from spotlight.sim.systems import SystemRun

__all__ = ["SimConfig", "SystemRun", "load_sim_config", "simulate"]
