"""Fixtures for run-store tests: memory://, file:// and a real S3 API (moto server) on loopback.

The S3 server is moto's ThreadedMotoServer on 127.0.0.1 and a free port, reached through s3fs
over HTTP -- never moto's in-process mock, which bypasses s3fs's HTTP path.
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Iterator

import pytest

from storage import StorageConfig

TEST_KEY = "AKIASPOTLIGHTTESTKEY"
TEST_SECRET = "spotlight-test-secret-do-not-log-0123456789"
BUCKET = "spotlight-tests"

_ENV = {
    # Newer botocore sends checksums some emulators reject.
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
    "AWS_EC2_METADATA_DISABLED": "true",  # never probe a metadata service for credentials
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@dataclass
class MotoS3:
    """A moto S3 server on loopback that a test can stop and restart on the same port."""

    port: int
    server: object

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        from moto.server import ThreadedMotoServer

        # moto's backends live in this process, so data survives a server restart.
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def config(self, prefix: str | None = None, **overrides) -> StorageConfig:
        prefix = prefix or f"runs/{uuid.uuid4().hex[:12]}"
        fields = dict(url=f"s3://{BUCKET}/{prefix}", endpoint_url=self.endpoint, key=TEST_KEY,
                      secret=TEST_SECRET, region="us-east-1", create_bucket=True, retries=2,
                      backoff_s=0.05, max_backoff_s=0.2, connect_timeout_s=2.0,
                      read_timeout_s=10.0, patience_s=0.0)
        fields.update(overrides)
        return StorageConfig(**fields)

    def storage_options(self) -> dict:
        """What a user with only xarray + s3fs passes to ``xarray.open_zarr``."""
        return {"endpoint_url": self.endpoint, "key": TEST_KEY, "secret": TEST_SECRET}


def _serial_moto_server():
    """moto's server with atomic conditional PUTs, as S3's are (pipelines.bench.serial_s3 says
    why), stoppable like ThreadedMotoServer."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    from pipelines.bench.serial_s3 import serial_server

    class SerialMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            self._server = serial_server(self._ip_address, self._port)
            self._server_ready_event.set()
            self._server.serve_forever()

    return SerialMotoServer(ip_address="127.0.0.1", port=0, verbose=False)


def _start_moto(serial: bool = False) -> MotoS3:
    from moto.server import ThreadedMotoServer

    server = (_serial_moto_server() if serial
              else ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False))
    server.start()
    _, port = server.get_host_and_port()
    return MotoS3(port=port, server=server)


@pytest.fixture(scope="session", autouse=True)
def _s3_environment() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One S3 server for the session (tests use unique prefixes)."""
    s3 = _start_moto()
    yield s3
    s3.stop()


@pytest.fixture(scope="session")
def serial_moto_s3() -> Iterator[MotoS3]:
    """An S3 server whose conditional writes are atomic, as S3's are (for racing writers)."""
    s3 = _start_moto(serial=True)
    yield s3
    s3.stop()


@pytest.fixture
def own_moto_s3() -> Iterator[MotoS3]:
    """A private S3 server a test may stop and restart (fault tests)."""
    s3 = _start_moto()
    yield s3
    try:
        s3.stop()
    except Exception:  # already stopped by the test
        pass


def backend_config(request: pytest.FixtureRequest, tmp_path, s3_fixture: str = "moto_s3"
                   ) -> StorageConfig:
    """A fresh run location on the backend ``request.param`` names."""
    name = uuid.uuid4().hex[:12]
    if request.param == "memory":
        return StorageConfig(url=f"memory://spotlight-tests/{name}", retries=1, backoff_s=0.01)
    if request.param == "file":
        return StorageConfig(url=f"file://{tmp_path}/run-{name}", retries=1, backoff_s=0.01)
    return request.getfixturevalue(s3_fixture).config()


@pytest.fixture(params=["memory", "file", "s3"])
def store_config(request: pytest.FixtureRequest, tmp_path) -> StorageConfig:
    """A fresh run location on each backend."""
    return backend_config(request, tmp_path)


@pytest.fixture(params=["memory", "file", "s3"])
def racing_config(request: pytest.FixtureRequest, tmp_path) -> StorageConfig:
    """A run location for racing writers; on S3 a server that decides conditions atomically."""
    return backend_config(request, tmp_path, s3_fixture="serial_moto_s3")
