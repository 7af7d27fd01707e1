"""Run URLs: one fsspec URL per run (``file://``, ``memory://``, ``s3://``).

``open_location(config)`` resolves a URL to a synchronous fsspec filesystem plus root path,
Zarr stores below it, and small-object helpers (atomic-as-possible writes, reads, listings),
all through :func:`storage.retry.call_with_retry`. ``check_reachable`` probes the store once so
an unreachable or misconfigured store fails before any work, naming the URL and endpoint.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import fsspec

from .config import StorageConfig
from .errors import StorageUnavailableError
from .operations import count as count_operation
from .retry import RetryPolicy, call_with_retry, register_secret, scrub

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class RunLocation:
    """A resolved run URL: filesystem, root path and the options to reach it."""

    url: str
    """Canonical URL of the run root (``file:///abs``, ``memory://name``, ``s3://bucket/prefix``)."""
    scheme: str
    root: str
    """Root path as the filesystem names it (no scheme)."""
    fs: Any = field(repr=False)
    """Synchronous fsspec filesystem."""
    storage_options: dict = field(repr=False, default_factory=dict)
    """fsspec options (credentials included) for ``xarray.open_zarr(..., storage_options=)``."""
    endpoint_url: str | None = None
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    _stores: dict = field(default_factory=dict, repr=False, compare=False)

    # -- names --------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """Filesystem path of ``parts`` below the root."""
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def child_url(self, *parts: str) -> str:
        """URL of ``parts`` below the root (what an error message or a user should see)."""
        return "/".join([self.url.rstrip("/"), *[p.strip("/") for p in parts if p]])

    # -- zarr ---------------------------------------------------------------------------------
    def zarr_store(self, *parts: str, read_only: bool = False) -> Any:
        """A Zarr v3 store rooted at ``parts`` below the run root."""
        import zarr.storage

        key = (parts, read_only)
        store = self._stores.get(key)
        if store is None:  # cached: one async filesystem (and connection pool) per store
            if self.scheme == "file":
                store = zarr.storage.LocalStore(self.path(*parts), read_only=read_only)
            else:
                store = zarr.storage.FsspecStore.from_url(
                    self.child_url(*parts), read_only=read_only,
                    storage_options=_async_options(self))
            store = self._stores.setdefault(key, store)
        return store

    # -- small objects ------------------------------------------------------------------------
    def retry(self, fn: Callable[[], T], what: str, *parts: str) -> T:
        """``fn()`` with retries; a final error names ``what``, the object and the endpoint."""
        count_operation(what)
        return call_with_retry(fn, what=what, url=self.child_url(*parts), policy=self.policy,
                               endpoint=self.endpoint_url)

    def write_bytes(self, data: bytes, *parts: str, durable: bool = True) -> None:
        """Write one object as atomically as the backend allows.

        S3 and memory: a single PUT (readers see the old or the new object, never a mix).
        Local: write a temporary file beside it (fsync'd if ``durable``: survives an OS crash,
        not only a killed process), then rename over the target.
        """
        path = self.path(*parts)
        if self.scheme == "file":
            self.retry(lambda: _atomic_local_write(path, data, durable), "write", *parts)
        else:
            self.retry(lambda: self.fs.pipe_file(path, data), "write", *parts)

    def read_bytes(self, *parts: str, small: bool = False) -> bytes:
        """Read one object; FileNotFoundError (naming the URL) if it does not exist.

        ``small``: a few kilobytes at most (markers, manifests): one GET, without the size
        probe s3fs makes first to split large objects into concurrent ranged reads.
        """
        path = self.path(*parts)
        options = {"max_concurrency": 1} if small and _splits_large_reads(self.fs) else {}

        def read() -> bytes:
            try:
                return self.fs.cat_file(path, **options)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.child_url(*parts)} does not exist") from None

        return self.retry(read, "read", *parts)

    def exists(self, *parts: str) -> bool:
        path = self.path(*parts)
        return self.retry(lambda: bool(self.fs.exists(path)), "check", *parts)

    def list_names(self, *parts: str) -> list[str]:
        """Sorted names directly below ``parts`` ([] if there is nothing there)."""
        path = self.path(*parts)

        def ls() -> list[str]:
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
            return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

        return self.retry(ls, "list", *parts)

    def remove(self, *parts: str) -> None:
        path = self.path(*parts)

        def rm() -> None:
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass

        self.retry(rm, "remove", *parts)


@functools.lru_cache(maxsize=None)
def _takes_max_concurrency(fs_type: type) -> bool:
    cat = getattr(fs_type, "_cat_file", None)
    try:
        return cat is not None and "max_concurrency" in inspect.signature(cat).parameters
    except (TypeError, ValueError):
        return False


def _splits_large_reads(fs: Any) -> bool:
    """Whether ``fs.cat_file`` takes ``max_concurrency`` (newer s3fs; then it probes the size
    of every object before reading it)."""
    return _takes_max_concurrency(type(fs))


def _atomic_local_write(path: str, data: bytes, durable: bool) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _async_options(loc: RunLocation) -> dict:
    return dict(loc.storage_options) if loc.scheme == "s3" else {}


def s3_options(config: StorageConfig) -> tuple[dict, str | None]:
    """s3fs options from the config, else the standard AWS environment variables.

    Returns (options, endpoint). botocore's own retries are off: :mod:`storage.retry` owns
    retrying so that every backend behaves alike and the final error is ours. Checksums are
    computed only when required, since some S3 emulators reject newer botocore's defaults.
    """
    env = os.environ
    endpoint = (config.endpoint_url or env.get("AWS_ENDPOINT_URL_S3")
                or env.get("AWS_ENDPOINT_URL") or None)
    key = config.key or env.get("AWS_ACCESS_KEY_ID") or None
    secret = config.secret or env.get("AWS_SECRET_ACCESS_KEY") or None
    token = config.token or env.get("AWS_SESSION_TOKEN") or None
    region = config.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    for value in (key, secret, token):
        register_secret(value)
    opts: dict[str, Any] = {
        "use_listings_cache": False,  # listings must reflect other workers' commits
        "config_kwargs": {
            "connect_timeout": config.connect_timeout_s,
            "read_timeout": config.read_timeout_s,
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        },
    }
    if endpoint:
        opts["endpoint_url"] = endpoint
    if key and secret:
        opts["key"], opts["secret"] = key, secret
    if token:
        opts["token"] = token
    if region:
        opts["client_kwargs"] = {"region_name": region}
    return opts, endpoint


def open_location(config: StorageConfig) -> RunLocation:
    """Resolve ``config.url`` to a :class:`RunLocation` (no I/O)."""
    policy = RetryPolicy(config.retries, config.backoff_s, config.max_backoff_s, config.patience_s)
    url = config.url
    scheme = config.scheme
    if scheme == "file":
        path = url.split("://", 1)[1] if "://" in url else url
        root = os.path.abspath(os.path.expanduser(path))
        return RunLocation(url="file://" + root, scheme="file", root=root,
                           fs=fsspec.filesystem("file"), policy=policy)
    if scheme == "memory":
        name = url.split("://", 1)[1].strip("/")
        if not name:
            raise ValueError(f"run URL {url!r} names no path; use memory://NAME")
        return RunLocation(url=f"memory://{name}", scheme="memory", root=f"/{name}",
                           fs=fsspec.filesystem("memory"), policy=policy)
    opts, endpoint = s3_options(config)
    root = url.split("://", 1)[1].strip("/")
    return RunLocation(url=f"s3://{root}", scheme="s3", root=root,
                       fs=fsspec.filesystem("s3", **opts), storage_options=opts,
                       endpoint_url=endpoint, policy=policy)


def check_reachable(loc: RunLocation, *, create_bucket: bool = False, create: bool = True) -> None:
    """Fail fast, with a message naming the URL and endpoint, if the run store is unusable.

    Without ``create`` nothing is made: a missing local run folder is left missing.
    """
    if loc.scheme == "memory":
        return
    if loc.scheme == "file":
        if os.path.exists(loc.root) and not os.path.isdir(loc.root):
            raise StorageUnavailableError(f"run URL {loc.url} is a file, not a directory")
        if not create:
            return
        try:
            os.makedirs(loc.root, exist_ok=True)
        except OSError as exc:
            raise StorageUnavailableError(f"cannot create run directory {loc.url}: {exc}") from exc
        return
    bucket = loc.root.split("/", 1)[0]
    where = f"s3://{bucket} at endpoint {loc.endpoint_url or '<AWS default>'}"

    def head_bucket() -> None:
        try:
            loc.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            if not create_bucket:
                raise
            _create_bucket(loc, bucket)

    try:   # first contact: a wrong endpoint fails fast, whatever the patience for outages
        call_with_retry(head_bucket, what="reach the bucket of", url=loc.url,
                        policy=dataclasses.replace(loc.policy, patience_s=0.0),
                        endpoint=loc.endpoint_url)
    except FileNotFoundError as exc:
        raise StorageUnavailableError(
            f"bucket {where} does not exist; create it or set StorageConfig.create_bucket=True "
            f"(run URL {loc.url})") from exc
    except PermissionError as exc:
        raise StorageUnavailableError(
            f"access to {where} denied ({scrub(str(exc))}); check the credentials "
            "(StorageConfig.key/secret or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from exc
    except StorageUnavailableError as exc:
        raise StorageUnavailableError(
            f"S3 unreachable: {where} (run URL {loc.url}): gave up after "
            f"{getattr(exc, 'attempts', '?')} attempts; last error: {getattr(exc, 'reason', exc)}. "
            "Nothing was done. Check StorageConfig.endpoint_url (or AWS_ENDPOINT_URL) and that "
            "the S3 service is running.") from exc
    except OSError as exc:  # a definite answer such as an invalid bucket name
        raise StorageUnavailableError(f"cannot use {where} (run URL {loc.url}): "
                                      f"{scrub(str(exc))}") from exc
    log.info("storage: reached %s", where)


def _create_bucket(loc: RunLocation, bucket: str) -> None:
    # Not fs.mkdir: s3fs sends LocationConstraint=us-east-1, which S3 refuses for that region.
    params: dict[str, Any] = {"Bucket": bucket}
    region = loc.storage_options.get("client_kwargs", {}).get("region_name")
    if region and region != "us-east-1":
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        loc.fs.call_s3("create_bucket", **params)
    except FileExistsError:
        pass  # created meanwhile by another process
    except OSError as exc:
        if "BucketAlreadyOwnedByYou" not in str(exc) and "already" not in str(exc).lower():
            raise
    log.info("storage: created bucket s3://%s", bucket)
