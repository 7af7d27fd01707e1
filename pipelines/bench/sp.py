"""``spotlight bench sp``: elastic sequence parallelism on persistent executors.

An embedded Dask cluster of ``devices`` worker processes (one "device" each, one node) holds a
real-format ``QwenImageTransformer2DModel`` whose weights lie in a run store. The bench:

1. *Equivalence*: groups of degree 4 and 2 compute a forward pass; its largest difference from
   the single-process forward (fp32).
2. *Regroup*, ``rounds`` times: a member of the serving group of 4 is SIGKILLed; from the kill
   until the survivors serve again as the largest group the degrees allow (the loss seen by
   the scheduler, a new communicator, the first forward). The worker's nanny then starts a
   fresh process, which copies the weights from a peer through the node's shared memory and
   rejoins: the group of 4 serves again before the next round.
3. *Without persistence*: the same kill, but the survivors are restarted instead of kept, as
   a system without persistent executors must: each loads the weights from the run store.
4. *Cold start*: one new process from nothing to serving -- start, imports, weights from the
   run store, group init, first forward.
"""
from __future__ import annotations

import contextlib
import tempfile
import time

import numpy as np
import torch

from pipelines.bench.registry import machine, register_bench
from pipelines.bench.sp_chaos import after_seconds, kill_when
from pipelines.bench.sp_requests import denoise_alone, denoise_requests
from pipelines.cluster import start_embedded
from pipelines.cluster.dask_log import run_log_file
from pipelines.parallel.groups import SPGroups, kill_executors, live_workers
from pipelines.parallel.serve import GroupServer
from spotlight.config import ClusterConfig
from storage import RunStore


# A tiny real-format transformer with 4 heads (so degrees 1, 2 and 4 divide them), 16 x 16
# image tokens and 8 text tokens.
def build_transformer(spec: dict) -> torch.nn.Module:
    """A ``QwenImageTransformer2DModel`` of the spec's config (weights come separately), as an
    SP executor holds it (:mod:`pipelines.parallel.executor`)."""
    from diffusers import QwenImageTransformer2DModel

    torch.set_num_threads(spec.get("threads", 1))
    return QwenImageTransformer2DModel(**spec["config"]).eval().requires_grad_(False)


SPEC = {"build": build_transformer,
        "config": dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                       attention_head_dim=32, num_attention_heads=4, joint_attention_dim=32,
                       axes_dims_rope=(8, 12, 12)), "threads": 1}
HEIGHT = WIDTH = 16
TEXT = 8


def request_inputs(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(1, HEIGHT * WIDTH, 16, generator=g),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "encoder_hidden_states_mask": torch.ones(1, TEXT, dtype=torch.long),
            "timestep": torch.tensor([0.5]), "img_shapes": [[(1, HEIGHT, WIDTH)]]}


def _percentiles(values: list[float]) -> dict:
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
            "runs": [float(v) for v in values]}


class Bench:
    """The cluster, the run store and the reference output of one bench run."""

    def __init__(self, client, url: str, reference: torch.Tensor) -> None:
        self.client, self.url, self.reference = client, url, reference

    def workers(self) -> list[str]:
        return live_workers(self.client)

    def wait_for(self, count: int, gone: str | None = None) -> list[str]:
        while len(self.workers()) != count or gone in self.workers():
            time.sleep(0.005)
        return self.workers()

    def groups(self, degrees: tuple[int, ...]) -> SPGroups:
        return SPGroups(self.client, SPEC, self.url, 0, degrees)

    def serve(self, sp: SPGroups) -> float:
        """One forward on the largest serving group; its difference from the reference."""
        group = largest_serving(sp)
        return float((sp.forward(group, request_inputs()) - self.reference).abs().max())



def largest_serving(sp: SPGroups):
    """The largest group that serves; an error carrying the membership's last moves if none
    does (as when the cluster closed a restarting worker's nanny: see
    :class:`pipelines.cluster.nanny.EmbeddedCluster`)."""
    serving = sp.membership.serving()
    if not serving:
        raise RuntimeError(f"bench sp: no SP group serves; executors "
                           f"{sorted(sp.membership.executors)}, last moves {sp.log[-8:]}")
    return max(serving, key=lambda g: g.degree)


def regroup_round(bench: Bench, sp: SPGroups, devices: int) -> dict:
    """Kill a member of the largest group; the survivors regroup and serve; the newcomer the
    nanny starts rejoins from a peer's shared memory."""
    victim = largest_serving(sp).members[-1]
    started = kill_executors(bench.client, [victim])
    bench.wait_for(devices - 1, gone=victim)
    seen = time.perf_counter()
    formed_log = len(sp.log)
    sp.lost(victim)
    regrouped = time.perf_counter()
    diff = bench.serve(sp)
    served = time.perf_counter()
    forms = [e for e in sp.log[formed_log:] if e["action"] == "form"]
    newcomer = [w for w in bench.wait_for(devices) if w not in sp.membership.executors]
    joined = time.perf_counter()
    copy_log = len(sp.log)
    sp.add(newcomer)
    bench.serve(sp)
    copies = [e for e in sp.log[copy_log:] if e["action"] == "copy"]
    return {"regroup_s": served - started, "detect_s": seen - started,
            "communicator_s": sum(e["communicator_s"] for e in forms),
            "form_s": regrouped - seen, "first_forward_s": served - regrouped,
            "diff": diff, "newcomer_join_s": time.perf_counter() - joined,
            # The copy itself; building the model in the fresh process (imports) apart.
            "newcomer_copy_s": max((e["load_s"] for e in copies), default=0.0),
            "newcomer_build_s": max((e.get("build_s", 0.0) for e in copies), default=0.0),
            "newcomer_via": sorted({e["via"] for e in copies})}


def restarted(bench: Bench, killed: list[str], wanted: int) -> tuple[float, list[str]]:
    """SIGKILL ``killed``; wait until their nannies have started ``wanted`` fresh processes;
    return when the kill happened and the fresh workers."""
    before = set(bench.workers())
    started = kill_executors(bench.client, killed)
    while True:
        fresh = [w for w in bench.workers() if w not in before]
        if len(fresh) >= wanted:
            return started, fresh[:wanted]
        time.sleep(0.005)


def without_persistence(bench: Bench, devices: int) -> float:
    """A member of the group of 4 is lost and the survivors are restarted instead of kept (as
    without persistent executors): each loads the weights from the run store; the groups the
    survivors form serve again."""
    started, fresh = restarted(bench, bench.workers(), devices - 1)
    sp = bench.groups((4, 2, 1))
    sp.add(fresh)
    bench.serve(sp)
    return time.perf_counter() - started


def cold_start(bench: Bench) -> float:
    """One process from nothing to serving: started (by its nanny), imports, weights from the
    run store, a group of one, the first forward."""
    started, fresh = restarted(bench, bench.workers()[:1], 1)
    sp = bench.groups((1,))
    sp.add(fresh)
    bench.serve(sp)
    return time.perf_counter() - started


def chaos(client, url: str, model, kills_s: list[float], requests: int = 8,
          steps: int = 60) -> dict:
    """Requests on SP pairs under the pull dispatcher while members are SIGKILLed at
    ``kills_s`` (seconds after serving begins, one member of a busy pair each): every request
    against its uninterrupted single-process result."""
    inputs = {f"r{i}": request_inputs(seed=100 + i) for i in range(requests)}
    sp = SPGroups(client, SPEC, url, 0, (2,))
    sp.add(live_workers(client))
    started = time.perf_counter()
    served = GroupServer(sp, denoise_requests(inputs, steps, url)).run(
        kill_when([after_seconds(t) for t in kills_s]))
    wall = time.perf_counter() - started
    diffs = {name: float((served.results[name].latents
                          - denoise_alone(model, request, steps)).abs().max())
             for name, request in inputs.items()}
    cut = [n for n, a in served.attempts.items() if a > 1]
    return {"requests": requests, "steps": steps, "kills": served.losses,
            "completed": len(served.results), "max_abs_diff": max(diffs.values()),
            "identical": sum(d == 0.0 for d in diffs.values()),
            "cut": len(cut), "resumed_steps": sum(served.resumed_from[n] for n in cut),
            "wall_s": wall}


@register_bench("sp")
def bench_sp(quick: bool = False, devices: int = 4, rounds: int | None = None,
             **_: object) -> dict:
    rounds = rounds or (2 if quick else 5)
    if devices < 4:
        raise ValueError(f"--devices {devices}: the bench forms a group of 4; give at least 4")
    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="spotlight-bench-sp-")
    url = f"file://{folder}/run"
    torch.manual_seed(0)
    model = build_transformer(SPEC)
    RunStore.open(url).save_checkpoint(0, model.state_dict(), None)
    with torch.no_grad():
        reference = model(**request_inputs(), return_dict=False)[0]
    # One "device" per worker process; a killed one's nanny starts a fresh process -- a fresh
    # interpreter (spawned), as a restarted process on a real node is: the cold start the
    # regroup is compared with includes the imports a forked worker would skip. --quick, a
    # smoke check of the same steps, forks its workers from a server that imported the
    # project: its cold start leaves the imports out.
    start_method = "forkserver" if quick else "spawn"
    dask_log = run_log_file(url).path
    handle = start_embedded(ClusterConfig(gpu_workers=devices, spot_workers=0, dashboard=False,
                                          start_method=start_method), log_file=dask_log)
    with contextlib.closing(handle):
        client = handle.client
        bench = Bench(client, url, reference)
        sp = bench.groups((4, 2, 1))
        sp.add(bench.wait_for(devices))
        diffs = {"sp4": bench.serve(sp)}
        two = bench.groups((2,))   # the same executors, re-formed as groups of 2
        two.add(bench.workers())
        diffs["sp2"] = bench.serve(two)
        sp = bench.groups((4, 2, 1))
        sp.add(bench.workers())
        regroups = [regroup_round(bench, sp, devices) for _ in range(rounds)]
        kills_s, requests, steps = ([1.0], 4, 30) if quick else ([1.0, 3.0, 5.0], 8, 60)
        under_kills = chaos(client, url, model, kills_s, requests=requests, steps=steps)
        unkept = [without_persistence(bench, devices) for _ in range(max(1, rounds // 2))]
        colds = [cold_start(bench) for _ in range(max(1, rounds // 2))]
    regroup = _percentiles([r["regroup_s"] for r in regroups])
    cold = _percentiles(colds)
    return {
        "bench": "sp", "devices": devices, "rounds": rounds, "worker_start": start_method,
        "max_abs_diff": diffs | {"after_regroup": max(r["diff"] for r in regroups)},
        "regroup_s": regroup, "cold_start_s": cold,
        "regroup_speedup": cold["p50"] / regroup["p50"],
        # The survivors keep their weights; the copy is the newcomer's, from a peer.
        "regroup_breakdown_s": {k: float(np.median([r[k] for r in regroups])) for k in (
            "detect_s", "communicator_s", "form_s", "first_forward_s")} | {
            "weight_copy_s": float(np.median([r["newcomer_copy_s"] for r in regroups]))},
        "regroup_without_persistence_s": _percentiles(unkept),
        "newcomer_join_s": _percentiles([r["newcomer_join_s"] for r in regroups]),
        "newcomer_build_s": float(np.median([r["newcomer_build_s"] for r in regroups])),
        "newcomer_copy_via": sorted({v for r in regroups for v in r["newcomer_via"]}),
        "chaos": under_kills,
        "wall_s": time.monotonic() - started, "machine": machine(), "dask_log": str(dask_log),
    }
