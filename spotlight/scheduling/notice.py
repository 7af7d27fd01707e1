"""Preemption notices: what the clouds' metadata services say, read as a notice or none.

Pure functions of a reply (HTTP status and body) and a clock; the polling itself -- HTTP
requests, a file on disk, SIGTERM -- is I/O and lives in :mod:`pipelines.cluster.notices`. Each
parser returns a :class:`Notice`, None (no notice now), or raises :class:`NoNotice` when the
reply cannot be understood (the poller keeps its message so an operator sees why a source is
silent).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

VALID_SOURCES = ("sigterm", "file", "aws", "gcp", "azure")
GCP_GRACE_S = 30.0  # GCP's documented preemption grace period

AWS_URL = "http://169.254.169.254/latest/meta-data/spot/instance-action"
AWS_TOKEN_URL = "http://169.254.169.254/latest/api/token"
GCP_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
AZURE_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"


@dataclass(frozen=True)
class Notice:
    """A preemption notice: which source saw it, why, and seconds left if the source says."""
    source: str
    reason: str
    deadline_s: float | None


class NoNotice(Exception):
    """The source could not be read or understood; the message says why."""


def http_failure(source: str, url: str, status: int, body: str) -> NoNotice:
    return NoNotice(f"{source}: HTTP {status} from {url}: {body.strip()[:200]}")


def aws_notice(status: int, body: str, url: str, now: float) -> Notice | None:
    """EC2's spot ``instance-action``: 404 none scheduled, 200 an action (even unparsable)."""
    if status == 404:  # no action scheduled
        return None
    if status != 200:
        raise http_failure("aws", url, status, body)
    try:  # a 200 means an action is scheduled, even if its body is unreadable
        doc = json.loads(body)
        action, when = str(doc["action"]), str(doc.get("time", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return Notice("aws", f"instance-action (unparsed): {body.strip()[:200]}", None)
    try:
        deadline: float | None = seconds_until(parse_iso(when), now)
    except ValueError:  # the action stands even if its time is unreadable
        deadline = None
    return Notice("aws", f"spot instance-action {action} at {when}: {body.strip()}", deadline)


def gcp_notice(status: int, body: str, url: str) -> Notice | None:
    """GCE's ``instance/preempted`` flag: TRUE or FALSE."""
    if status != 200:
        raise http_failure("gcp", url, status, body)
    value = body.strip().upper()
    if value == "TRUE":
        return Notice("gcp", "GCE instance/preempted is TRUE", GCP_GRACE_S)
    if value == "FALSE":
        return None
    raise NoNotice(f"gcp: unexpected body from {url}: {body.strip()[:200]!r}")


def azure_notice(status: int, body: str, url: str, now: float) -> Notice | None:
    """Azure Scheduled Events: a notice when any event has EventType "Preempt"."""
    if status != 200:
        raise http_failure("azure", url, status, body)
    doc = json.loads(body)
    for ev in (doc.get("Events") or []) if isinstance(doc, dict) else []:
        if isinstance(ev, dict) and ev.get("EventType") == "Preempt":
            try:
                when = parsedate_to_datetime(str(ev.get("NotBefore") or ""))
            except (TypeError, ValueError, IndexError):
                when = None
            deadline = seconds_until(when, now) if when is not None else None
            reason = (f"Azure scheduled event Preempt id={ev.get('EventId')} "
                      f"NotBefore={ev.get('NotBefore')!r} resources={ev.get('Resources')}")
            return Notice("azure", reason, deadline)
    return None


def parse_iso(text: str) -> datetime:
    """UTC ISO 8601 with a trailing Z (Python 3.10's fromisoformat does not accept Z)."""
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


def seconds_until(when: datetime, now: float) -> float:
    """Seconds from ``now`` to ``when``, floored at 0 (a past deadline means "now")."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)
