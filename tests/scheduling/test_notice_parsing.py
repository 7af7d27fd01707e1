"""What a metadata reply means, without any I/O (the HTTP polling is tested in pipelines)."""
import pytest

from spotlight.scheduling.notice import (
    GCP_GRACE_S,
    NoNotice,
    aws_notice,
    azure_notice,
    gcp_notice,
    parse_iso,
)

NOW = parse_iso("2026-11-24T12:00:00Z").timestamp()


def test_aws_instance_action():
    assert aws_notice(404, "", "u", NOW) is None
    notice = aws_notice(200, '{"action": "terminate", "time": "2026-11-24T12:02:00Z"}', "u", NOW)
    assert notice.source == "aws" and notice.deadline_s == 120.0 and "terminate" in notice.reason
    assert aws_notice(200, "garbage", "u", NOW).deadline_s is None   # still an action
    with pytest.raises(NoNotice, match="aws: HTTP 500 from u"):
        aws_notice(500, "oops", "u", NOW)


def test_gcp_preempted_flag():
    assert gcp_notice(200, "FALSE", "u") is None
    assert gcp_notice(200, "TRUE\n", "u").deadline_s == GCP_GRACE_S
    with pytest.raises(NoNotice, match="unexpected body"):
        gcp_notice(200, "maybe", "u")


def test_azure_scheduled_preempt_event():
    body = ('{"Events": [{"EventType": "Reboot"}, {"EventType": "Preempt", "EventId": "e1", '
            '"NotBefore": "Tue, 24 Nov 2026 12:00:30 GMT", "Resources": ["vm1"]}]}')
    notice = azure_notice(200, body, "u", NOW)
    assert notice.deadline_s == 30.0 and "e1" in notice.reason
    assert azure_notice(200, '{"Events": []}', "u", NOW) is None
