"""Retry transient storage errors with exponential backoff, then fail with a clear error.

Transient: connection refused/reset, timeouts, 5xx turned into ``OSError`` by s3fs. Not
transient: missing objects, permission errors, integrity errors, bad arguments -- retrying
those only delays the message the user needs.
"""
from __future__ import annotations

import errno
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from .errors import StorageError, StoragePermanentError, StorageUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

_PERMANENT_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError)
# What no retry can fix, with what to do about it; raised at once as StoragePermanentError.
_PERMANENT_ERRNOS = {errno.EROFS: "the file system is read-only; write the run elsewhere (--store)",
                     errno.ENOSPC: "the disk is full; free space, then resume",
                     errno.EDQUOT: "the disk quota is exhausted; free space, then resume"}
_TRANSIENT_NAMES = ("ConnectionError", "EndpointConnectionError", "ConnectTimeoutError",
                    "ReadTimeoutError", "ConnectionClosedError", "HTTPClientError",
                    "ServerDisconnectedError", "ClientConnectorError", "ClientOSError",
                    "ClientPayloadError", "IncompleteRead", "ResponseStreamingError",
                    "FSTimeoutError", "ProxyConnectionError")

# Secrets registered here are masked in every message this package logs or raises. A private
# RNG for jitter: the global ``random`` state belongs to the user and the determinism contract.
_SECRETS: set[str] = set()
_JITTER = random.Random()


def register_secret(value: str | None) -> None:
    """Mask ``value`` in messages from now on (called for configured credentials)."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def scrub(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    for secret in _SECRETS:
        text = text.replace(secret, "***")
    return text


def contains_secret(text: str) -> str | None:
    """The first registered secret found in ``text`` (masked), or None."""
    for secret in _SECRETS:
        if secret in text:
            return secret[:2] + "***"
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised ``exc`` may succeed."""
    if isinstance(exc, StorageError):
        return False
    if isinstance(exc, _PERMANENT_OS_ERRORS):
        return False
    status = _http_status(exc)
    if status is not None:  # an answer from the server: only throttling and 5xx may pass
        return status == 429 or status >= 500
    if isinstance(exc, OSError) and exc.errno in (errno.EINVAL, errno.EACCES, errno.ENOENT,
                                                  errno.EPERM, *_PERMANENT_ERRNOS):
        return False
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


def _http_status(exc: BaseException) -> int | None:
    """HTTP status of a botocore ClientError behind ``exc`` (s3fs chains it as the cause)."""
    seen = 0
    while exc is not None and seen < 5:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry."""

    retries: int = 4
    """Retries after the first attempt."""
    backoff_s: float = 0.2
    """First delay; doubled at each further retry."""
    max_backoff_s: float = 5.0
    """Cap of one delay."""
    patience_s: float = 0.0
    """Keep retrying for at least this long after the first failure, whatever ``retries``
    says: an object store that is away for a while (its host cut off, restarted) is waited
    for, not given up on."""

    def delay(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based), with +-25% jitter."""
        base = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
        return base * _JITTER.uniform(0.75, 1.25)


def call_with_retry(fn: Callable[[], T], *, what: str, url: str, policy: RetryPolicy,
                    endpoint: str | None = None) -> T:
    """Run ``fn()``; retry transient errors per ``policy``; then raise StorageUnavailableError.

    ``what`` says what was being done (``"write latent step 3"``) and ``url`` which object, so
    the final error names both, the endpoint and the number of attempts.
    """
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified right below
            if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
                raise StoragePermanentError(
                    f"could not {what} {url}: {scrub(str(exc))}. Not retried: "
                    f"{_PERMANENT_ERRNOS[exc.errno]}; data committed before this error is "
                    "intact.") from exc
            if not is_transient(exc):
                raise
            attempt += 1
            reason = scrub(f"{type(exc).__name__}: {exc}")
            waited = time.monotonic() - start
            if attempt > policy.retries and waited >= policy.patience_s:
                where = f" at endpoint {endpoint}" if endpoint else ""
                err = StorageUnavailableError(
                    f"could not {what} {url}{where}: gave up after {attempt} attempts in "
                    f"{waited:.1f}s (patience {policy.patience_s:g}s); last error: {reason}. "
                    "Check that the storage service is running and reachable; data committed "
                    "before this error is intact.")
                err.attempts, err.reason = attempt, reason
                raise err from exc
            delay = policy.delay(attempt)
            if attempt <= policy.retries:
                log.warning("storage: %s %s failed (%s); retry %d/%d in %.2fs", what, url,
                            reason, attempt, policy.retries, delay)
            else:   # waiting on patience: never sleep far past it
                delay = min(delay, max(policy.patience_s - waited, 0.0) + policy.backoff_s)
                log.warning("storage: %s %s still failing after %.0fs (%s); patience %gs, "
                            "next try in %.2fs", what, url, waited, reason, policy.patience_s,
                            delay)
            time.sleep(delay)
