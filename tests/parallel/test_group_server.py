"""SP groups as workers of the pull dispatcher, while members are SIGKILLed: every request
completes with the uninterrupted result, a cut one resumed from its committed steps."""
from __future__ import annotations

import pytest
import torch

from pipelines.bench.sp import SPEC, build_transformer, request_inputs
from pipelines.bench.sp_chaos import after_committed, kill_when
from pipelines.bench.sp_requests import denoise_alone, denoise_requests
from pipelines.parallel import executor
from pipelines.parallel.groups import SPGroups, live_workers
from pipelines.parallel.serve import GroupRequestFailed, GroupServer
from tests.ports import LOOPBACK_HTTP

pytestmark = pytest.mark.timeout(400)
STEPS = 60


def test_requests_survive_members_killed_under_them(tmp_path):
    from distributed import Client, LocalCluster

    from storage import RunStore

    torch.manual_seed(0)
    model = build_transformer(SPEC)
    url = f"file://{tmp_path}/run"
    RunStore.open(url).save_checkpoint(0, model.state_dict(), None)
    requests = {f"r{i}": request_inputs(seed=10 + i) for i in range(4)}
    expected = {name: denoise_alone(model, inputs, STEPS) for name, inputs in requests.items()}
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, host="127.0.0.1",
                      **LOOPBACK_HTTP) as cluster, Client(cluster) as client:
        client.wait_for_workers(4)
        sp = SPGroups(client, SPEC, url, 0, (2,))
        sp.add(live_workers(client))
        assert [g.degree for g in sp.membership.serving()] == [2, 2]
        served = GroupServer(sp, denoise_requests(requests, STEPS, url)).run(
            kill_when([after_committed(10, url), after_committed(10, url)]))
    assert served.losses == 2
    assert sorted(served.results) == sorted(requests)
    for name in requests:
        assert float((served.results[name].latents - expected[name]).abs().max()) <= 1e-5, name
    cut = [n for n, a in served.attempts.items() if a > 1]
    assert cut and all(served.resumed_from[n] >= 10 for n in cut)   # not from the start


def test_a_request_that_fails_without_a_loss_stops_serving_with_its_name(tmp_path):
    """Not requeued for ever: a request whose attempt raises while its group lost nobody is a
    bug, named with its error."""
    from distributed import Client, LocalCluster

    from storage import RunStore

    torch.manual_seed(0)
    url = f"file://{tmp_path}/run"
    RunStore.open(url).save_checkpoint(0, build_transformer(SPEC).state_dict(), None)
    broken = {"hidden_states": torch.zeros(1, 3, 5)}   # no text stream: the forward raises
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      **LOOPBACK_HTTP) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        sp = SPGroups(client, SPEC, url, 0, (2,))
        sp.add(live_workers(client))
        server = GroupServer(sp, {"r-broken": (executor.forward, (broken,))})
        with pytest.raises(GroupRequestFailed, match="r-broken.*lost no member"):
            server.run()
        assert server.served.attempts == {"r-broken": 1}
