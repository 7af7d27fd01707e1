"""Typed configuration of the run store.

Credentials (``key``, ``secret``, ``token``) live only in memory: they are excluded from
``repr``, from ``public_dict()`` (what goes into manifests, logs and Zarr attributes) and are
never written anywhere by the run store.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_SCHEMES = ("file", "memory", "s3")
SECRET_FIELDS = ("key", "secret", "token")


@dataclass(kw_only=True, slots=True)
class StorageConfig:
    """Where a run lives and how the run store talks to it."""

    url: str = "runs/default"
    """Run URL: ``file://PATH`` (a bare path means file, relative to the working directory),
    ``memory://NAME`` (in-process, for tests) or ``s3://BUCKET/PREFIX``."""

    endpoint_url: str | None = None
    """S3 endpoint (e.g. ``http://127.0.0.1:9000`` for MinIO or moto). None: the
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` environment variables, else AWS itself."""

    key: str | None = field(default=None, repr=False)
    """S3 access key id. None: ``AWS_ACCESS_KEY_ID`` or botocore's credential chain. Never
    stored."""

    secret: str | None = field(default=None, repr=False)
    """S3 secret access key. None: ``AWS_SECRET_ACCESS_KEY`` or botocore's chain. Never stored."""

    token: str | None = field(default=None, repr=False)
    """S3 session token. None: ``AWS_SESSION_TOKEN`` if set. Never stored."""

    region: str | None = None
    """S3 region. None: ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else botocore's default."""

    create_bucket: bool = False
    """Create the S3 bucket at open if it does not exist (handy for MinIO/moto; off for AWS)."""

    check_on_open: bool = True
    """Probe the store when a run is opened, so an unreachable store fails before any work."""

    queue_size: int = 64
    """Latent commits a sink may hold before ``commit()`` blocks (back-pressure, bounded memory)."""

    commit_interval_s: float = 0.0
    """Longest a latent sink holds back a request's commit marker after a written step (the
    final step and ``flush()`` commit at once). The default 0 writes a marker after every write
    batch, so a preempted request resumes from its last denoising step; a positive interval
    halves the object writes per step at the price of up to this much recomputation."""

    retries: int = 4
    """Retries of a transient storage error after the first attempt; then a clear error."""

    backoff_s: float = 0.2
    """Delay before the first retry; doubled at each further retry (with jitter)."""

    max_backoff_s: float = 5.0
    """Upper bound of a single retry delay."""

    patience_s: float = 60.0
    """How long a transient storage error is retried before the run stops with a clear error
    (at least ``retries`` times): an object store whose host is cut off or restarting for less
    than this costs a pause, not the run. What was committed before stays either way, and the
    run resumes from it. (A driver whose lease renewal is still failing when its lease expires,
    ``lease_ttl_s`` after the last renewal, stops as fenced, whatever the patience.)"""

    connect_timeout_s: float = 5.0
    """S3 connect timeout of one attempt."""

    read_timeout_s: float = 30.0
    """S3 read timeout of one attempt."""

    lease_ttl_s: float = 30.0
    """How long a driver's lease on the run outlives its last renewal (renewed every third of
    it). A second driver is refused while the lease lives; after a crash, ``--takeover`` takes
    it once it has expired."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError("StorageConfig.url must be a non-empty string such as 'runs/my-run', "
                             "'memory://my-run' or 's3://bucket/prefix'")
        scheme = self.url.split("://", 1)[0] if "://" in self.url else "file"
        if scheme == "s3a":
            scheme = "s3"
        if scheme not in SUPPORTED_SCHEMES:
            raise ValueError(f"StorageConfig.url = {self.url!r} uses scheme {scheme!r}; supported "
                             f"schemes are {', '.join(s + '://' for s in SUPPORTED_SCHEMES)}")
        if scheme == "s3" and "@" in self.url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError("StorageConfig.url must not carry credentials (user:secret@bucket); "
                             "set key/secret in the config or AWS_ACCESS_KEY_ID/"
                             "AWS_SECRET_ACCESS_KEY in the environment")
        if scheme == "s3" and not self.url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError(f"StorageConfig.url = {self.url!r} names no bucket; "
                             "use s3://BUCKET/PREFIX")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(("http://", "https://")):
            raise ValueError(f"StorageConfig.endpoint_url = {self.endpoint_url!r} must start with "
                             "http:// or https://")
        _check_int("queue_size", self.queue_size, 1, 1_000_000)
        _check_float("commit_interval_s", self.commit_interval_s, 0.0, 3600.0)
        _check_int("retries", self.retries, 0, 100)
        _check_float("backoff_s", self.backoff_s, 0.0, 600.0)
        _check_float("max_backoff_s", self.max_backoff_s, 0.0, 3600.0)
        _check_float("patience_s", self.patience_s, 0.0, 86400.0)
        _check_float("connect_timeout_s", self.connect_timeout_s, 0.01, 600.0)
        _check_float("read_timeout_s", self.read_timeout_s, 0.01, 3600.0)
        _check_float("lease_ttl_s", self.lease_ttl_s, 0.1, 86400.0)
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"StorageConfig.max_backoff_s = {self.max_backoff_s} must be >= "
                             f"backoff_s = {self.backoff_s}")
        if (self.key is None) != (self.secret is None):
            raise ValueError("StorageConfig.key and StorageConfig.secret must be given together "
                             "(or both left to the environment)")

    @property
    def scheme(self) -> str:
        """``file``, ``memory`` or ``s3``."""
        scheme = self.url.split("://", 1)[0] if "://" in self.url else "file"
        return "s3" if scheme == "s3a" else scheme

    def public_dict(self) -> dict[str, Any]:
        """Every field except the credentials: safe for manifests, logs and attributes."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in SECRET_FIELDS}

    def with_url(self, url: str) -> "StorageConfig":
        """The same settings for another run URL."""
        return dataclasses.replace(self, url=url)


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"StorageConfig.{name} = {value!r} must be an integer in [{lo}, {hi}]")


def _check_float(name: str, value: Any, lo: float, hi: float) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not lo <= value <= hi):
        raise ValueError(f"StorageConfig.{name} = {value!r} must be a number in [{lo}, {hi}]")
