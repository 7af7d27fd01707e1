"""Shared fixtures: a private artefact cache, tiny configs that train in seconds and a loopback
stand-in for the clouds' metadata services."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from spotlight.config import ModelConfig, load_config


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Tests never read or write the user's cache; recogniser/base models are trained once per
    session."""
    path = tmp_path_factory.mktemp("spotlight-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTLIGHT_CACHE", str(path))
    mp.delenv("SPOTLIGHT_MODELS", raising=False)   # nor a bench's shipped models
    torch.set_num_threads(2)
    yield path
    mp.undo()


TINY_MODEL = dict(num_layers=1, num_attention_heads=1, attention_head_dim=16, text_dim=16,
                  text_layers=1)


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return ModelConfig(**TINY_MODEL)


@pytest.fixture
def tiny_config():
    """The default OCR config shrunk to train in seconds (same code paths)."""
    return load_config("configs/digits.yaml", {
        "model": TINY_MODEL,
        "pretrain.steps": 3, "pretrain.batch_size": 8, "pretrain.warmup_steps": 1,
        "grpo.prompts_per_iteration": 2, "grpo.group_size": 4, "grpo.micro_batch": 4,
        "sampler.num_steps": 4, "validation.max_prompts": 4, "validation.every": 1,
    })


def require_netns() -> None:
    """Network namespaces can be made here. Where they cannot the test skips with the reason
    -- except in CI (SPOTLIGHT_REQUIRE_NETNS=1, set by .ci/run, which runs as root), where
    that is a failure: a skipped partition test proves nothing."""
    import os

    from pipelines.bench.testbed import unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("SPOTLIGHT_REQUIRE_NETNS") == "1":
            pytest.fail(f"SPOTLIGHT_REQUIRE_NETNS=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture
def netns() -> None:
    require_netns()


@pytest.fixture
def testbed(netns):
    """A multi-host test bed (network namespaces; see ``require_netns``)."""
    from pipelines.bench.testbed import Testbed

    with Testbed() as bed:
        yield bed


@pytest.fixture(scope="module")
def module_testbed():
    """One test bed for a whole module, whose tests then run in file order on it, as the
    bench commands run their scenarios: a bed and its cluster cost tens of seconds each."""
    from pipelines.bench.testbed import Testbed

    require_netns()
    with Testbed() as bed:
        yield bed


class FakeMetadata:
    """Routes (method, path) -> (status, body, {header: required value}); records every request
    (header names lower-cased: urllib title-cases them on the wire)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, str, dict[str, str]]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.base = ""

    def route(self, method: str, path: str, status: int, body: str = "", require=None) -> None:
        self.routes[(method, path)] = (status, body, require or {})

    def seen(self, method: str, path: str) -> list[dict[str, str]]:
        return [h for m, p, h in self.requests if (m, p) == (method, path)]


@pytest.fixture
def server():
    """A loopback HTTP server answering as ``route`` tells it (tests/pipelines/test_notices.py,
    tests/deploy/test_cloud_class.py)."""
    fake = FakeMetadata()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            fake.requests.append((self.command, self.path,
                                  {k.lower(): v for k, v in self.headers.items()}))
            status, body, require = fake.routes.get((self.command, self.path),
                                                    (404, "not found", {}))
            missing = [k for k, v in require.items() if self.headers.get(k) != v]
            if missing:  # metadata servers refuse requests without their marker header
                status = 401 if "X-aws-ec2-metadata-token" in missing else 403
                body = f"missing {missing}"
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = _serve

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    fake.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
