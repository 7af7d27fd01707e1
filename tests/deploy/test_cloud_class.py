"""The cloud metadata plugin: each cloud's documented reply sets the worker's class, on a real
Dask worker, and a spot worker acts on the same service's termination notice. Against a
loopback HTTP server (tests/conftest.py's `server`), no cloud and no internet."""
from __future__ import annotations

import asyncio
import json

import pytest
from distributed import Client, Scheduler, Worker

from pipelines.cluster import cloud_class
from pipelines.cluster.cloud_class import (
    CLASS_PATHS,
    CloudClassSettings,
    Decision,
    Found,
    classify,
    cloud_class_plugin,
    decide,
)
from pipelines.cluster.preemption import NOTICE_TOPIC, noticed, reset_notice
from tests.pipelines.test_notices import ACTION, AZURE, GCP, TOKEN

LIFE_CYCLE, PREEMPTIBLE, COMPUTE = CLASS_PATHS["aws"], CLASS_PATHS["gcp"], CLASS_PATHS["azure"]
AWS_TOKEN = "imds-session-token"


def azure_compute(priority: str) -> str:
    """A compute document as Azure IMDS documents it (fields trimmed; ``priority`` kept)."""
    return json.dumps({"azEnvironment": "AzurePublicCloud", "location": "westeurope",
                       "name": "spot-vm-0", "priority": priority, "provider": "Microsoft.Compute",
                       "vmSize": "Standard_NC24ads_A100_v4", "vmScaleSetName": "",
                       "zone": "1"})


def serve(server, cloud: str, answer: str) -> None:
    """The documented class endpoint of ``cloud`` answering ``answer``, with each service's
    access rule enforced (AWS: IMDSv2 token only; GCP/Azure: their marker header)."""
    if cloud == "aws":
        server.route("PUT", TOKEN, 200, AWS_TOKEN,
                     require={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        server.route("GET", LIFE_CYCLE, 200, answer,
                     require={"X-aws-ec2-metadata-token": AWS_TOKEN})
    elif cloud == "gcp":
        server.route("GET", PREEMPTIBLE, 200, answer, require={"Metadata-Flavor": "Google"})
    else:
        server.route("GET", COMPUTE, 200, azure_compute(answer), require={"Metadata": "true"})


def settings(server, *clouds: str, **kw) -> CloudClassSettings:
    base = server.base
    return CloudClassSettings(clouds=clouds or ("aws", "gcp", "azure"), aws_url=base + ACTION,
                              gcp_url=base + GCP, azure_url=base + AZURE, timeout_s=2.0, **kw)


DOCUMENTED = [("aws", "spot", "spot"), ("aws", "on-demand", "gpu"), ("aws", "scheduled", "gpu"),
              ("aws", "capacity-block", "gpu"), ("gcp", "TRUE", "spot"), ("gcp", "FALSE", "gpu"),
              ("azure", "Spot", "spot"), ("azure", "Low", "spot"), ("azure", "Regular", "gpu")]


@pytest.mark.parametrize("cloud,answer,expected", DOCUMENTED)
def test_each_documented_answer_gives_its_class(server, cloud, answer, expected):
    serve(server, cloud, answer)
    found, reasons = classify(settings(server, cloud))
    assert found == Found(cloud, expected), reasons
    if cloud == "aws":   # IMDSv2: the life cycle was read with the session token
        (headers,) = server.seen("GET", LIFE_CYCLE)
        assert headers["x-aws-ec2-metadata-token"] == AWS_TOKEN


def test_the_first_service_that_answers_wins_and_the_others_say_why(server):
    serve(server, "gcp", "TRUE")   # AWS's and Azure's paths are 404 on this host
    found, reasons = classify(settings(server, "aws", "azure", "gcp"))
    assert found == Found("gcp", "spot")
    assert len(reasons) == 2 and reasons[0].startswith("aws: HTTP 404")
    assert reasons[1].startswith("azure: HTTP 404")


@pytest.mark.parametrize("cloud,body,needle", [
    ("aws", "reserved-ish", "unknown instance-life-cycle"),
    ("gcp", "MAYBE", "expected TRUE or FALSE"),
    ("azure", "not json", "compute document")])
def test_an_unknown_answer_is_no_class_with_its_reason(server, cloud, body, needle):
    path = {"aws": LIFE_CYCLE, "gcp": PREEMPTIBLE, "azure": COMPUTE}[cloud]
    server.route("GET", path, 200, body)
    server.route("PUT", TOKEN, 200, AWS_TOKEN)
    found, (reason,) = classify(settings(server, cloud))
    assert found is None and needle in reason


def test_a_missing_marker_header_is_refused_by_the_fake_and_reported(server):
    server.route("GET", PREEMPTIBLE, 200, "TRUE", require={"Metadata-Flavor": "Bogus"})
    found, (reason,) = classify(settings(server, "gcp"))
    assert found is None and "HTTP 403" in reason


def test_decisions():
    spot = Found("aws", "spot")
    assert decide([], spot, "") == Decision("spot", "class spot from aws metadata", False)
    kept = decide(["gpu"], spot, "")
    assert kept.worker_class is None and kept.warn and "keeping gpu" in kept.message
    assert decide(["spot"], spot, "") == Decision(None, "class spot from the command line", False)
    assert decide([], None, "gpu").worker_class == "gpu"
    none = decide([], None, "")
    assert none.worker_class is None and none.warn and "SPOTLIGHT_CLASS_FALLBACK" in none.message


def test_settings_from_the_environment():
    env = {"SPOTLIGHT_CLOUDS": "gcp, aws", "SPOTLIGHT_CLASS_FALLBACK": "GPU",
           "SPOTLIGHT_WORKER_SLOTS": "2", "SPOTLIGHT_GCP_URL": "http://127.0.0.1:1/x",
           "SPOTLIGHT_NOTICE_POLL_S": "0.5"}
    got = CloudClassSettings.from_env(env)
    assert ((got.clouds, got.fallback, got.slots, got.notice_poll_s)
            == (("gcp", "aws"), "gpu", 2, 0.5))
    assert got.notice_url("gcp") == "http://127.0.0.1:1/x" and got.notice_url("aws").startswith(
        "http://169.254.169.254/")
    assert CloudClassSettings.from_env({"SPOTLIGHT_CLOUDS": "none"}).clouds == ()
    assert CloudClassSettings.from_env({}).clouds == ("aws", "gcp", "azure")
    with pytest.raises(ValueError, match=r"unknown cloud\(s\) \['oracle'\]"):
        CloudClassSettings.from_env({"SPOTLIGHT_CLOUDS": "aws,oracle"})
    with pytest.raises(ValueError, match="SPOTLIGHT_CLASS_FALLBACK='cheap'"):
        CloudClassSettings.from_env({"SPOTLIGHT_CLASS_FALLBACK": "cheap"})


# --- on a real Dask worker ----------------------------------------------------------------------

def run(coroutine):
    """Run a cluster coroutine; the notice flag is process-wide, so it never outlives a test."""
    try:
        return asyncio.run(asyncio.wait_for(coroutine, 60))
    finally:
        reset_notice()


async def until(predicate, what: str, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def preload_env(monkeypatch, server, clouds: str) -> None:
    monkeypatch.setenv("SPOTLIGHT_CLOUDS", clouds)
    monkeypatch.setenv("SPOTLIGHT_AWS_URL", server.base + ACTION)
    monkeypatch.setenv("SPOTLIGHT_GCP_URL", server.base + GCP)
    monkeypatch.setenv("SPOTLIGHT_AZURE_URL", server.base + AZURE)
    monkeypatch.setenv("SPOTLIGHT_NOTICE_POLL_S", "0.05")


@pytest.mark.parametrize("cloud,answer,expected", [("aws", "spot", "spot"), ("gcp", "FALSE", "gpu"),
                                                   ("azure", "Spot", "spot")])
def test_preload_registers_the_worker_with_its_class(server, monkeypatch, cloud, answer, expected):
    """``dask worker ADDR --preload pipelines.cluster.cloud_class`` with no --resources: the
    worker registers as the class its VM's metadata says."""
    serve(server, cloud, answer)
    server.route("PUT", TOKEN, 200, AWS_TOKEN)
    preload_env(monkeypatch, server, cloud)

    async def main():
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with Worker(s.address, nthreads=1,
                              preload=["pipelines.cluster.cloud_class"]) as w:
                # set before it registered: the scheduler never saw it without a class
                assert s.workers[w.address].resources == {expected: 1}
                assert w.state.available_resources == {expected: 1}
                return w.plugins[cloud_class.PLUGIN_NAME]

    plugin = run(main())
    assert plugin.found == Found(cloud, expected)
    assert (plugin.watch is not None) == (expected == "spot")


def test_a_spot_worker_hands_back_and_retires_on_its_clouds_notice(server, monkeypatch):
    serve(server, "gcp", "TRUE")
    server.route("GET", GCP, 200, "FALSE", require={"Metadata-Flavor": "Google"})
    preload_env(monkeypatch, server, "gcp")

    async def main():
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with Worker(s.address, nthreads=1,
                              preload=["pipelines.cluster.cloud_class"]) as w:
                await until(lambda: len(server.seen("GET", GCP)) >= 2, "the notice polls")
                assert noticed() is None and w.address in s.workers
                server.route("GET", GCP, 200, "TRUE", require={"Metadata-Flavor": "Google"})
                await until(lambda: w.address not in s.workers, "the worker to retire")
                return noticed(), s.get_events(NOTICE_TOPIC)

    notice, events = run(main())
    assert notice.source == "gcp" and "preempted is TRUE" in notice.reason
    (_, event), = events
    assert event["source"] == "gcp"


def test_registered_from_a_client_it_sets_the_class_with_set_resources(server):
    """A pool that takes no preload (the plugin registered before the run starts)."""
    serve(server, "aws", "on-demand")

    async def main():
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with Worker(s.address, nthreads=1) as w:
                assert s.workers[w.address].resources == {}
                async with Client(s.address, asynchronous=True) as client:
                    await client.register_plugin(cloud_class_plugin(settings(server, "aws")))
                return dict(s.workers[w.address].resources), dict(s.resources)

    resources, by_resource = run(main())
    assert resources == {"gpu": 1}
    assert list(by_resource) == ["gpu"]


def test_the_command_line_class_wins_over_the_metadata(server, monkeypatch, caplog):
    serve(server, "azure", "Spot")
    preload_env(monkeypatch, server, "azure")

    async def main():
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with Worker(s.address, nthreads=1, resources={"gpu": 1},
                              preload=["pipelines.cluster.cloud_class"]) as w:
                return dict(s.workers[w.address].resources), w.plugins[cloud_class.PLUGIN_NAME]

    with caplog.at_level("WARNING", logger="pipelines.cluster.cloud_class"):
        resources, plugin = run(main())
    assert resources == {"gpu": 1} and plugin.watch is None
    assert "azure metadata says spot; keeping gpu" in caplog.text
