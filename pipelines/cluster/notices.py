"""Preemption notice sources: how a spot worker learns it is about to be reclaimed (the I/O).

A worker plugin calls :meth:`NoticeSource.check` on each configured source every poll
interval. A source never raises on network trouble: a connection error, timeout, HTTP error
or malformed reply means "no notice now", and the reason is kept in ``last_error`` so an
operator can see why a source is silent. What a reply means is decided by the pure parsers of
:mod:`spotlight.scheduling.notice`; SIGTERM is handled by the worker plugin itself. Stdlib
only; metadata requests bypass any HTTP proxy set in the environment.
"""
from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from spotlight.scheduling.notice import (
    AWS_TOKEN_URL,
    AWS_URL,
    AZURE_URL,
    GCP_URL,
    VALID_SOURCES,
    NoNotice,
    Notice,
    aws_notice,
    azure_notice,
    gcp_notice,
)

_MAX_BODY = 1 << 16
# Link-local / internal metadata services must never go through an HTTP proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NoticeSource:
    """Base class: subclasses set ``name`` and implement :meth:`_poll`."""
    name = "base"

    def __init__(self) -> None:
        self.last_error: str | None = None

    def check(self) -> Notice | None:
        """The current notice, or None. Never raises on network or parse trouble."""
        try:
            notice = self._poll()
        except (NoNotice, OSError, http.client.HTTPException, ValueError) as e:
            self.last_error = str(e) if isinstance(e, NoNotice) else \
                f"{self.name}: {type(e).__name__}: {e}"
            return None
        self.last_error = None
        return notice

    def _poll(self) -> Notice | None:
        raise NotImplementedError


def metadata_request(method: str, url: str, headers: dict[str, str],
                     timeout_s: float) -> tuple[int, str]:
    """(status, body) for any HTTP reply, 4xx/5xx included; network errors raise OSError.
    Every metadata read of the project goes through here (notices, a worker's class)."""
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(_MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        with e:
            body = e.read(_MAX_BODY).decode("utf-8", "replace") if e.fp is not None else ""
        return e.code, body


class FileNotice(NoticeSource):
    """Notice when ``path`` exists (e.g. touched by an operator or a node agent)."""
    name = "file"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)

    def _poll(self) -> Notice | None:
        if not self.path.exists():
            return None
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:  # a directory, or unreadable: it still exists
            text = ""
        return Notice(self.name, text or "file exists", None)


class AwsNotice(NoticeSource):
    """EC2 spot instance-action via IMDSv2, falling back to IMDSv1 if no token can be had."""
    name = "aws"

    def __init__(self, url: str = AWS_URL, token_url: str = AWS_TOKEN_URL, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.url, self.token_url, self.timeout_s, self.clock = url, token_url, timeout_s, clock

    def _poll(self) -> Notice | None:
        status, body = aws_get(self.url, self.token_url, self.timeout_s)
        return aws_notice(status, body, self.url, self.clock())


def aws_token(token_url: str, timeout_s: float) -> str | None:
    """An IMDSv2 session token, or None where none can be had (IMDSv1 answers without one)."""
    try:
        status, body = metadata_request("PUT", token_url,
                                        {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout_s)
    except (OSError, http.client.HTTPException):
        return None
    return (body.strip() or None) if status == 200 else None


def aws_get(url: str, token_url: str, timeout_s: float) -> tuple[int, str]:
    """GET an EC2 instance metadata path with an IMDSv2 token when the service gives one."""
    token = aws_token(token_url, timeout_s)
    headers = {"X-aws-ec2-metadata-token": token} if token else {}
    return metadata_request("GET", url, headers, timeout_s)


class GcpNotice(NoticeSource):
    """GCE preemptible/spot VM: the metadata server's ``instance/preempted`` flag."""
    name = "gcp"

    def __init__(self, url: str = GCP_URL, timeout_s: float = 0.5) -> None:
        super().__init__()
        self.url, self.timeout_s = url, timeout_s

    def _poll(self) -> Notice | None:
        status, body = metadata_request("GET", self.url, {"Metadata-Flavor": "Google"},
                                        self.timeout_s)
        return gcp_notice(status, body, self.url)


class AzureNotice(NoticeSource):
    """Azure Scheduled Events: a notice when any event has EventType "Preempt"."""
    name = "azure"

    def __init__(self, url: str = AZURE_URL, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.url, self.timeout_s, self.clock = url, timeout_s, clock

    def _poll(self) -> Notice | None:
        status, body = metadata_request("GET", self.url, {"Metadata": "true"}, self.timeout_s)
        return azure_notice(status, body, self.url, self.clock())


def same_host(url: str, path: str) -> str:
    """``path`` (a query may follow it) on the scheme and host of ``url``: another endpoint of
    the same metadata service, a mock one included."""
    parts = urllib.parse.urlsplit(url)
    path, _, query = path.partition("?")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def aws_token_url(url: str) -> str:
    """The IMDSv2 token endpoint of the metadata service that serves ``url``."""
    return same_host(url, "/latest/api/token")


def build_sources(names: Iterable[str], *, file_path: str = "", aws_url: str = "",
                  gcp_url: str = "", azure_url: str = "") -> list[NoticeSource]:
    """Sources for ``names`` in order; "sigterm" (handled by the worker plugin) and blanks are
    skipped."""
    sources: list[NoticeSource] = []
    for raw in names:
        name = raw.strip().lower()
        if not name or name == "sigterm":
            continue
        if name == "file":
            if not file_path:
                raise ValueError("notice source 'file' needs a path: set file_path "
                                 "(the file whose appearance signals preemption)")
            sources.append(FileNotice(file_path))
        elif name == "aws":
            # A custom instance-action URL (a mock IMDS) gets its token from the same host.
            sources.append(AwsNotice(aws_url, aws_token_url(aws_url)) if aws_url else AwsNotice())
        elif name == "gcp":
            sources.append(GcpNotice(gcp_url or GCP_URL))
        elif name == "azure":
            sources.append(AzureNotice(azure_url or AZURE_URL))
        else:
            raise ValueError(f"unknown notice source {raw!r}; valid names: "
                             f"{', '.join(VALID_SOURCES)}")
    return sources


def first_notice(sources: Iterable[NoticeSource]) -> Notice | None:
    """The notice from the first source that reports one, or None (later sources are not polled)."""
    for source in sources:
        notice = source.check()
        if notice is not None:
            return notice
    return None
