"""Preemption notice sources against a real loopback HTTP server (tests/conftest.py's `server`;
no sleeps, no internet)."""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from pipelines.cluster.notices import (
    AwsNotice,
    AzureNotice,
    FileNotice,
    GcpNotice,
    NoticeSource,
    build_sources,
    first_notice,
)
from spotlight.scheduling.notice import AWS_URL, AZURE_URL, GCP_URL, VALID_SOURCES, Notice

ACTION = "/latest/meta-data/spot/instance-action"
TOKEN = "/latest/api/token"
GCP = "/computeMetadata/v1/instance/preempted"
AZURE = "/metadata/scheduledevents?api-version=2020-07-01"




def _epoch(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def _aws(server, **kw) -> AwsNotice:
    return AwsNotice(server.base + ACTION, server.base + TOKEN, timeout_s=2.0, **kw)


# --- AWS ---------------------------------------------------------------------------------------

def test_aws_404_means_no_notice(server):
    server.route("PUT", TOKEN, 200, "tok")
    server.route("GET", ACTION, 404, "Not Found")
    src = _aws(server)
    assert src.check() is None
    assert src.last_error is None


def test_aws_action_gives_notice_with_deadline_from_injected_clock(server):
    body = json.dumps({"action": "terminate", "time": "2026-11-22T12:00:00Z"})
    server.route("PUT", TOKEN, 200, "tok")
    server.route("GET", ACTION, 200, body)
    notice = _aws(server, clock=lambda: _epoch(2026, 11, 22, 11, 58, 0)).check()
    assert isinstance(notice, Notice)
    assert notice.source == "aws"
    assert "terminate" in notice.reason
    assert notice.deadline_s == 120.0


def test_aws_past_deadline_floors_at_zero(server):
    server.route("GET", ACTION, 200, json.dumps({"action": "stop", "time": "2026-11-22T12:00:00Z"}))
    notice = _aws(server, clock=lambda: _epoch(2026, 11, 22, 12, 0, 5)).check()
    assert notice is not None and notice.deadline_s == 0.0 and "stop" in notice.reason


def test_aws_imdsv2_token_is_sent(server):
    server.route("PUT", TOKEN, 200, "secret-token",
                 require={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    server.route("GET", ACTION, 200,
                 json.dumps({"action": "hibernate", "time": "2026-11-22T12:00:00Z"}),
                 require={"X-aws-ec2-metadata-token": "secret-token"})
    notice = _aws(server, clock=lambda: _epoch(2026, 11, 22, 12, 0, 0)).check()
    assert notice is not None and "hibernate" in notice.reason
    assert [h.get("x-aws-ec2-metadata-token-ttl-seconds")
            for h in server.seen("PUT", TOKEN)] == ["60"]
    assert [h.get("x-aws-ec2-metadata-token")
            for h in server.seen("GET", ACTION)] == ["secret-token"]


@pytest.mark.parametrize("token_status", [404, 405])
def test_aws_falls_back_to_imdsv1_without_token(server, token_status):
    server.route("PUT", TOKEN, token_status, "no tokens here")
    server.route("GET", ACTION, 200,
                 json.dumps({"action": "terminate", "time": "2026-11-22T12:00:00Z"}))
    notice = _aws(server, clock=lambda: _epoch(2026, 11, 22, 11, 59, 30)).check()
    assert notice is not None and notice.deadline_s == 30.0
    (headers,) = server.seen("GET", ACTION)
    assert "x-aws-ec2-metadata-token" not in headers


def test_aws_5xx_is_silent_with_last_error(server):
    server.route("PUT", TOKEN, 200, "tok")
    server.route("GET", ACTION, 503, "busy")
    src = _aws(server)
    assert src.check() is None
    assert "503" in src.last_error
    server.route("GET", ACTION, 404)  # recovers: the error is cleared on the next good poll
    assert src.check() is None and src.last_error is None


def test_aws_unparseable_200_still_a_notice(server):
    server.route("GET", ACTION, 200, "not json")
    notice = _aws(server).check()
    assert notice is not None and notice.deadline_s is None and "not json" in notice.reason
    server.route("GET", ACTION, 200, json.dumps({"action": "terminate", "time": "soon"}))
    notice = _aws(server).check()
    assert notice is not None and notice.deadline_s is None and "terminate" in notice.reason


# --- GCP ---------------------------------------------------------------------------------------

def test_gcp_server_requires_metadata_flavor_header(server):
    server.route("GET", GCP, 200, "TRUE", require={"Metadata-Flavor": "Google"})
    with pytest.raises(urllib.error.HTTPError) as err:  # the fake really enforces the header
        urllib.request.urlopen(server.base + GCP, timeout=2)
    assert err.value.code == 403
    err.value.close()


@pytest.mark.parametrize("body,expected", [("TRUE", True), ("FALSE", False), ("TRUE\n", True)])
def test_gcp_preempted_flag(server, body, expected):
    server.route("GET", GCP, 200, body, require={"Metadata-Flavor": "Google"})
    src = GcpNotice(server.base + GCP, timeout_s=2.0)
    notice = src.check()
    assert src.last_error is None
    if expected:
        assert notice == Notice("gcp", notice.reason, 30.0)
    else:
        assert notice is None


def test_gcp_forbidden_is_silent_with_last_error(server):
    server.route("GET", GCP, 403, "forbidden")
    src = GcpNotice(server.base + GCP, timeout_s=2.0)
    assert src.check() is None and "403" in src.last_error


# --- Azure -------------------------------------------------------------------------------------

def _azure_events(*events) -> str:
    return json.dumps({"DocumentIncarnation": 1, "Events": list(events)})


def _event(kind: str, not_before: str = "Mon, 19 Sep 2016 18:29:47 GMT") -> dict:
    return {"EventId": f"id-{kind}", "EventType": kind, "ResourceType": "VirtualMachine",
            "Resources": ["vm-0"], "EventStatus": "Scheduled", "NotBefore": not_before}


def test_azure_preempt_gives_notice_with_deadline(server):
    server.route("GET", AZURE, 200, _azure_events(_event("Freeze"), _event("Preempt")),
                 require={"Metadata": "true"})
    src = AzureNotice(server.base + AZURE, timeout_s=2.0,
                      clock=lambda: _epoch(2016, 9, 19, 18, 29, 17))
    notice = src.check()
    assert notice is not None and notice.source == "azure"
    assert notice.deadline_s == 30.0
    assert "id-Preempt" in notice.reason


def test_azure_freeze_only_or_no_events_is_no_notice(server):
    server.route("GET", AZURE, 200, _azure_events(_event("Freeze"), _event("Reboot")),
                 require={"Metadata": "true"})
    src = AzureNotice(server.base + AZURE, timeout_s=2.0)
    assert src.check() is None and src.last_error is None
    server.route("GET", AZURE, 200, _azure_events(), require={"Metadata": "true"})
    assert src.check() is None and src.last_error is None


def test_azure_unparseable_not_before_gives_no_deadline(server):
    server.route("GET", AZURE, 200, _azure_events(_event("Preempt", not_before="")),
                 require={"Metadata": "true"})
    notice = AzureNotice(server.base + AZURE, timeout_s=2.0).check()
    assert notice is not None and notice.deadline_s is None


# --- network trouble ---------------------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sources(base: str, timeout_s: float) -> list[NoticeSource]:
    return [AwsNotice(base + ACTION, base + TOKEN, timeout_s=timeout_s),
            GcpNotice(base + GCP, timeout_s=timeout_s),
            AzureNotice(base + AZURE, timeout_s=timeout_s)]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["aws", "gcp", "azure"])
def test_server_down_is_silent_with_last_error(index):
    src = _sources(f"http://127.0.0.1:{_closed_port()}", timeout_s=0.5)[index]
    start = time.monotonic()
    assert src.check() is None
    assert time.monotonic() - start < 2 * 0.5 + 1.0  # two requests (AWS) at most, generous slack
    assert src.last_error


@pytest.mark.parametrize("index", [0, 1, 2], ids=["aws", "gcp", "azure"])
def test_unresponsive_server_times_out(index):
    """A listener that accepts connections (backlog) but never answers: the poll hits timeout_s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        src = _sources(f"http://127.0.0.1:{s.getsockname()[1]}", timeout_s=0.2)[index]
        start = time.monotonic()
        assert src.check() is None
        assert time.monotonic() - start < 2 * 0.2 + 1.5
    assert "timed out" in src.last_error.lower()


# --- file --------------------------------------------------------------------------------------

def test_file_notice_before_and_after(tmp_path):
    path = tmp_path / "preempt"
    src = FileNotice(path)
    assert src.check() is None
    path.write_text("  draining for maintenance\n")
    assert src.check() == Notice("file", "draining for maintenance", None)
    path.write_text("")
    assert src.check() == Notice("file", "file exists", None)


# --- build_sources / first_notice --------------------------------------------------------------

def test_build_sources_defaults_and_sigterm_skipped(tmp_path):
    sources = build_sources(["sigterm", "file", "aws", "gcp", "azure"],
                            file_path=str(tmp_path / "x"))
    assert [type(s) for s in sources] == [FileNotice, AwsNotice, GcpNotice, AzureNotice]
    assert [s.name for s in sources] == ["file", "aws", "gcp", "azure"]
    assert (sources[1].url, sources[2].url, sources[3].url) == (AWS_URL, GCP_URL, AZURE_URL)
    assert build_sources(["sigterm"]) == []


def test_build_sources_custom_urls(server):
    server.route("PUT", TOKEN, 200, "tok")
    server.route("GET", ACTION, 404)
    aws, gcp = build_sources(["aws", "gcp"], aws_url=server.base + ACTION,
                             gcp_url=server.base + GCP)
    assert aws.token_url == server.base + TOKEN  # the token comes from the same (mock) host
    assert gcp.url == server.base + GCP
    assert aws.check() is None and aws.last_error is None
    assert len(server.seen("PUT", TOKEN)) == 1


def test_build_sources_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_sources(["aws", "oracle"])
    msg = str(err.value)
    assert "oracle" in msg
    assert all(name in msg for name in VALID_SOURCES)


def test_build_sources_file_without_path():
    with pytest.raises(ValueError, match="file_path"):
        build_sources(["file"])


class _Fixed(NoticeSource):
    def __init__(self, notice):
        super().__init__()
        self.notice, self.calls = notice, 0

    def _poll(self):
        self.calls += 1
        return self.notice


def test_first_notice_returns_first_reporting_source():
    a, b, c = _Fixed(None), _Fixed(Notice("file", "b", None)), _Fixed(Notice("gcp", "c", 30.0))
    assert first_notice([a, b, c]) == Notice("file", "b", None)
    assert (a.calls, b.calls, c.calls) == (1, 1, 0)
    assert first_notice([a]) is None and first_notice([]) is None
