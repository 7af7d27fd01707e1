"""``spotlight bench stock-workers``: the same iterations on the embedded cluster and on stock
``dask scheduler`` / ``dask worker`` processes started with default options in an empty folder.

What it answers: does a user's own cluster, started as the README says, run Spotlight as fast
as the embedded one (whose workers the project configures itself), and compute the same thing?
Both runs: one gpu and one spot worker on this machine, the same base model and seeds, the
planner off and the exploration deadline off (so the two compare bit for bit). The rounds
alternate the order, so a drifting machine weighs on both alike.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.bench.registry import machine, register_bench
from pipelines.front.session import Session
from spotlight.config import RunConfig, load_config, shipped_config
from spotlight.models.pretrain import pretrain
from spotlight.rewards import build_reward


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StockCluster:
    """``dask scheduler`` on loopback and ``dask worker ADDR --resources X=1`` per class."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        self.procs = [self._start(folder, "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--no-dashboard")]
        self.procs += [self._start(folder, "distributed.cli.dask_worker", self.address,
                                   "--resources", f"{cls}=1") for cls in ("gpu", "spot")]

    @staticmethod
    def _start(folder: Path, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def close(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _run(config: RunConfig, url: str, iterations: int) -> dict:
    with Session.from_config(config, store=url) as session:
        session.run(iterations)
        results = session.results
        rewards = session.store.open_rewards()["reward"].values
    return {"wall_s": [r.wall_s for r in results], "rewards": np.nan_to_num(rewards, nan=-1.0)}


@register_bench("stock-workers")
def bench_stock_workers(quick: bool = False, config: str | None = None,
                        iterations: int | None = None, rounds: int | None = None,
                        json_path: str | None = None, **_: object) -> dict:
    started = time.monotonic()
    overrides = {"planner.enabled": False, "exploration.deadline": False,
                 "cluster.dashboard": False, "validation.every": 1000}
    if quick:
        overrides.update({"grpo.prompts_per_iteration": 4, "grpo.group_size": 4,
                          "grpo.micro_batch": 16, "validation.max_prompts": 8,
                          "exploration.candidates": 8, "exploration.request_batch": 8})
    cfg = load_config(config or shipped_config("digits.yaml"), overrides)
    iterations = iterations or (2 if quick else 4)
    rounds = rounds or (1 if quick else 2)
    pretrain(cfg)
    build_reward(cfg.reward)
    root = Path(tempfile.mkdtemp(prefix="spotlight-bench-stock-"))
    walls: dict[str, list[float]] = {"embedded": [], "stock": []}
    rewards: dict[str, np.ndarray] = {}
    for r in range(rounds):
        for kind in (("embedded", "stock") if r % 2 == 0 else ("stock", "embedded")):
            if kind == "embedded":
                out = _run(cfg, str(root / f"embedded-{r}"), iterations)
            else:
                cluster = StockCluster(root / f"stock-cwd-{r}")
                try:
                    out = _run(cfg.with_values({"cluster.scheduler": cluster.address}),
                               str(root / f"stock-{r}"), iterations)
                finally:
                    cluster.close()
            walls[kind] += out["wall_s"][1:]   # iteration 0 also warms the workers up
            rewards.setdefault(kind, out["rewards"])
            print(f"round {r} {kind:8s} s/iteration {np.round(out['wall_s'], 2).tolist()}",
                  flush=True)
    embedded, stock = float(np.median(walls["embedded"])), float(np.median(walls["stock"]))
    return {"bench": "stock-workers", "config": cfg.source, "iterations": iterations,
            "rounds": rounds, "embedded_s_per_iteration": embedded,
            "stock_s_per_iteration": stock, "stock_over_embedded": stock / embedded,
            "identical_rewards": bool(np.array_equal(rewards["embedded"], rewards["stock"])),
            "walls": walls, "machine": machine(), "wall_s": time.monotonic() - started,
            "runs": str(root)}
