"""Errors of the run store. Each message names the object (URL) involved and what to do."""
from __future__ import annotations


class StorageError(RuntimeError):
    """Base class of every error the run store raises on purpose."""


class StorageUnavailableError(StorageError):
    """The storage backend could not be reached (at open, or after retries with backoff)."""


class StoragePermanentError(StorageError):
    """The storage refused for a reason retrying cannot fix: read-only, full, no permission."""


class ObjectError(StorageError):
    """An error about one stored object: its URL and the reason, in ``template``."""

    template = "{url}: {reason}"

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(self.template.format(url=url, reason=reason))
        self.url = url
        self.reason = reason

    def __reduce__(self) -> tuple:   # raised in worker tasks: it travels back to the driver
        return (type(self), (self.url, self.reason))


class CorruptObjectError(ObjectError):
    """A stored object failed its integrity check (sha256, crc32c, missing chunk, bad JSON)."""

    template = "corrupt object {url}: {reason}"


class WriteConflict(ObjectError):
    """A conditional write lost: the object exists (create) or changed (replace)."""

    template = "conditional write of {url} refused: {reason}"


class NotCommittedError(StorageError):
    """Something was asked for that the run store has no commit record of."""


class StreamOvertakenError(StorageError):
    """A request's stream was opened at a step the run store already holds: another attempt of
    the same request (a speculative twin, or one given up on that still runs) got there first.
    This attempt stops; the request goes on from the store's committed step."""


class SinkClosedError(StorageError):
    """A latent sink was used after close()."""


class DriverFenced(StorageError):
    """This driver lost the run's lease to another driver (a takeover); the store refuses its
    run-state writes from then on."""
