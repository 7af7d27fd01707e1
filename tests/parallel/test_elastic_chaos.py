"""Elastic SP on real worker processes while the weights change under it: a pair trains a new
version in place, a version is published, members are SIGKILLed mid-copy and mid-request, one
process loses its weights without leaving (a restart at the same address), the nannies' fresh
processes join -- and every request's result equals, bit for bit, what the same sequence gives
with nobody killed."""
from __future__ import annotations

import time

import pytest
import torch

from pipelines.bench.sp import SPEC, build_transformer, request_inputs
from pipelines.bench.sp_chaos import after_committed, kill_when
from pipelines.bench.sp_requests import denoise_alone, denoise_requests
from pipelines.cluster.runtime import runtime
from pipelines.parallel import executor
from pipelines.parallel.groups import SPGroups, kill_executors, live_workers
from pipelines.parallel.serve import GroupServer
from tests.parallel.in_place_training import train_step
from tests.ports import LOOPBACK_HTTP

pytestmark = pytest.mark.timeout(900)
STEPS = 24
WORKERS = 4


def published_weights(model: torch.nn.Module) -> dict:
    """Version 2 as training would publish it: every weight moved."""
    return {k: v * 0.9 + 0.01 for k, v in model.state_dict().items()}


def train_batch() -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    inputs = request_inputs(seed=3)
    batch = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v * 2
             for k, v in inputs.items()}
    batch["hidden_states"] = torch.randn(batch["hidden_states"].shape, generator=g)
    return batch, torch.randn(batch["hidden_states"].shape[0], 256, 4 * 4, generator=g)


def restarted_in_place(dask_worker) -> None:
    """On a worker: what a process restarted at the same address holds -- no weights, no
    group, its old connections reset (the scheduler saw nobody leave)."""
    executor.leave(abort=True)
    runtime(dask_worker).clear()


def wait_for_workers(client, count: int) -> list[str]:
    deadline = time.monotonic() + 120
    while len(live_workers(client)) != count:
        assert time.monotonic() < deadline, "the nannies did not restart the killed workers"
        time.sleep(0.05)
    return live_workers(client)


def serve(sp: SPGroups, url: str, phase: str, kills: int) -> tuple[dict, GroupServer]:
    requests = {f"{phase}-r{i}": request_inputs(seed=20 + i) for i in range(4)}
    server = GroupServer(sp, denoise_requests(requests, STEPS, url))
    served = server.run(kill_when([after_committed(8, url) for _ in range(kills)]))
    assert sorted(served.results) == sorted(requests)
    return {name: out.latents for name, out in served.results.items()}, server


def scenario(client, url: str, chaos: bool, v2: dict) -> dict:
    """v0 served -> a pair trains v1 in place (the others copy it) and serves -> v2 is
    published while (chaos) a member dies unseen, found gone mid-copy -> its replacement
    joins -> v2 served. With ``chaos`` a member of a busy group is also killed in each phase."""
    sp = SPGroups(client, SPEC, url, 0, (2,))
    sp.add(wait_for_workers(client, WORKERS))
    out, resumed = {}, 0
    for phase in ("v0", "v1", "v2"):
        if phase == "v1":
            trainers = sorted(sp.membership.serving(), key=lambda g: g.members)[0]
            batch, target = train_batch()
            futures = sp.submit(trainers, train_step, batch, target, 0.05, 1)
            assert [f.result() is not None for f in futures] == [True, False]
            sp.trained(1, trainers)
            if chaos:   # its next request fails; it is found without weights and copies again
                others = [g for g in sp.membership.serving() if g != trainers]
                client.run(restarted_in_place, workers=[others[0].members[0]])
        if phase == "v2":
            from storage import RunStore

            RunStore.open(url, create=False).save_checkpoint(2, v2, None)
            if chaos:   # dies unseen: the copies of v2 find it gone and are issued again
                kill_executors(client, [sorted(sp.membership.serving(),
                                               key=lambda g: g.members)[-1].members[-1]])
            sp.published(2)
            assert sp.version == 2 and sp.membership.serving()
            fresh = [w for w in wait_for_workers(client, WORKERS)
                     if w not in sp.membership.executors]
            sp.add(fresh)
        results, server = serve(sp, url, phase, kills=1 if chaos else 0)
        out[phase] = results
        resumed += sum(1 for r, a in server.served.attempts.items()
                       if a > 1 and server.served.resumed_from[r] > 0)
        wait_for_workers(client, WORKERS)
        fresh = [w for w in live_workers(client) if w not in sp.membership.executors]
        if fresh:
            sp.add(fresh)
    out["losses"], out["resumed"] = sp.losses, resumed
    out["not_held"] = [e["executor"] for e in sp.log if e["action"] == "not-held"]
    return out


def test_sp_groups_under_kills_while_versions_change_compute_what_an_undisturbed_run_does(
        tmp_path):
    from distributed import Client, LocalCluster

    from storage import RunStore

    torch.manual_seed(0)
    model = build_transformer(SPEC)
    v2 = published_weights(model)
    urls = {}
    for name in ("clean", "chaos"):
        urls[name] = f"file://{tmp_path}/{name}"
        RunStore.open(urls[name]).save_checkpoint(0, model.state_dict(), None)
    with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                      host="127.0.0.1", **LOOPBACK_HTTP) as cluster, \
            Client(cluster) as client:
        runs = {name: scenario(client, urls[name], name == "chaos", v2)
                for name in ("clean", "chaos")}
    clean, chaos = runs["clean"], runs["chaos"]
    assert clean["losses"] == 0 and chaos["losses"] >= 4   # three in requests, one mid-copy
    assert chaos["resumed"] >= 1   # a cut request resumed from its committed steps
    assert clean["not_held"] == [] and len(chaos["not_held"]) == 1
    for phase in ("v0", "v1", "v2"):
        for request, latents in clean[phase].items():
            assert torch.equal(chaos[phase][request], latents), (phase, request)
    # The weights moved between versions (else equal results would compare nothing).
    first = sorted(clean["v0"])[0].split("-", 1)[1]
    v0, v1, v2_ = (clean[p][f"{p}-{first}"] for p in ("v0", "v1", "v2"))
    assert not torch.equal(v0, v1) and not torch.equal(v1, v2_)
    expected = denoise_alone(model, request_inputs(seed=20), STEPS)
    assert float((v0 - expected).abs().max()) <= 1e-5
