"""The reference reward server: one reward scored over HTTP, protocol 1 (docs/reward-service.md).

The standard library's ``ThreadingHTTPServer``: each connection gets a thread, and one lock lets
one batch at a time into the reward (OCR engines and torch models are not thread-safe, and one
GPU gains nothing from interleaving batches). At most ``max_waiting`` requests queue behind the
batch being scored; the next ones are answered 503 with ``Retry-After``, which clients retry.
``spotlight serve-reward`` (:mod:`pipelines.front.reward_server`) is its command line; tests
start it in a thread (:meth:`RewardServer.start`).
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import numpy as np

from spotlight.config import RewardConfig
from spotlight.config.base import replaced
from spotlight.rewards import RewardFn, build_reward
from spotlight.rewards.service import (
    HEALTH_PATH,
    SCORE_PATH,
    Health,
    ProtocolError,
    decode_request,
    encode_rewards,
    error_body,
)

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_BODY_BYTES = 512 * 2**20
DEFAULT_MAX_WAITING = 8
Answer = tuple[int, bytes, dict]


def build_served_reward(config: RewardConfig) -> RewardFn:
    """The reward a server computes in its own process: ``config``'s, whatever its
    ``service.url`` says (a server that called a service would call itself)."""
    return build_reward(replaced(config, {"service.url": ""}))


def is_loopback(host: str) -> bool:
    """Whether ``host`` listens on this machine only (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    reward_server: "RewardServer"


class _Server6(_Server):
    address_family = socket.AF_INET6


class RewardServer:
    """Serves ``reward`` on ``host:port`` (0: a free port; :attr:`url` tells which)."""

    def __init__(self, reward: RewardFn, *, host: str = "127.0.0.1", port: int = 0,
                 max_batch: int = DEFAULT_MAX_BATCH, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_waiting: int = DEFAULT_MAX_WAITING,
                 log: Callable[[str], None] | None = None) -> None:
        self.reward, self.max_waiting = reward, max_waiting
        self.health = Health(reward.name, max_batch, max_body_bytes,
                             float(reward.recognizer_accuracy))
        self.log = log or (lambda line: None)
        self._scoring, self._count, self._active = threading.Lock(), threading.Lock(), 0
        self.httpd = (_Server6 if ":" in host else _Server)((host, port), _Handler)
        self.httpd.reward_server = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> "RewardServer":
        """Serve from a daemon thread (tests, notebooks); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="reward-server",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def score(self, body: bytes) -> Answer:
        """The answer to a ``POST /v1/score`` body: status, body and extra headers."""
        name, limit = self.reward.name, self.health.max_batch
        try:
            request = decode_request(body)
        except ProtocolError as err:
            return err.status, error_body(err.code, str(err)), {}
        if request.reward is not None and request.reward != name:
            return 409, error_body("wrong_reward", f"this server scores reward '{name}', not "
                                   f"'{request.reward}'; set reward.name: {name} or use a "
                                   f"server started with --reward {request.reward}"), {}
        if len(request.images) > limit:
            return 413, error_body("batch_too_large", f"{len(request.images)} images; this "
                                   f"server takes at most {limit} per request (max_batch of "
                                   "GET /health): split the batch"), {}
        with self._count:
            if self._active > self.max_waiting:
                return 503, error_body("busy", f"{self._active} batches are being scored or "
                                       "waiting; retry after Retry-After seconds"), \
                    {"Retry-After": "1"}
            self._active += 1
        try:
            with self._scoring:
                return self._scored(request.images, request.prompts)
        finally:
            with self._count:
                self._active -= 1

    def _scored(self, images: np.ndarray, prompts: list) -> Answer:
        name, start = self.reward.name, time.perf_counter()
        try:
            values = np.asarray(self.reward(images, prompts), np.float64).reshape(-1)
        except ValueError as err:   # the reward refuses this batch (prompt family, NaN canvases)
            return 422, error_body("unprocessable", f"reward '{name}': {err}"), {}
        except Exception as err:  # noqa: BLE001 - a scorer's crash is answered, and logged
            self.log(f"reward '{name}' raised on a batch of {len(images)}:\n"
                     + traceback.format_exc())
            return 500, error_body("internal", f"reward '{name}' raised {type(err).__name__}: "
                                   f"{err}; see the reward server's log"), {}
        if len(values) != len(images) or not np.isfinite(values).all():
            return 500, error_body("internal", f"reward '{name}' returned {len(values)} values "
                                   f"for {len(images)} images, or non-finite ones: "
                                   f"{values[:10].tolist()}"), {}
        self.log(f"scored {len(images)} images in {time.perf_counter() - start:.2f} s")
        return 200, encode_rewards(values, name), {}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "spotlight-reward/1"
    timeout = 300   # seconds a silent client may hold its connection's thread

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == HEALTH_PATH:
            self._send(200, self.server.reward_server.health.to_json())
        elif path == SCORE_PATH:
            self._send(405, error_body("method_not_allowed", f"{SCORE_PATH} takes POST"),
                       {"Allow": "POST"})
        else:
            self._not_found(path)

    def do_POST(self) -> None:
        path, server = self.path.split("?")[0], self.server.reward_server
        if path != SCORE_PATH:
            if path == HEALTH_PATH:
                return self._send(405, error_body("method_not_allowed", f"{path} takes GET"),
                                  {"Allow": "GET"})
            return self._not_found(path)
        length, limit = self.headers.get("Content-Length"), server.health.max_body_bytes
        if length is None or not length.isdigit():
            return self._send(411, error_body("length_required", "send the body with a "
                                              "Content-Length header (no chunked encoding)"))
        if int(length) > limit:
            self.close_connection = True   # the body is not read
            return self._send(413, error_body("body_too_large", f"a body of {length} bytes; "
                                              f"this server takes at most {limit} (max_body_bytes "
                                              "of GET /health): send fewer images per request"))
        status, body, headers = server.score(self.rfile.read(int(length)))
        if status != 200:
            server.log(f"HTTP {status} to {self.client_address[0]}: {body[:300].decode()}")
        self._send(status, body, headers)

    def _not_found(self, path: str) -> None:
        self._send(404, error_body("not_found", f"no route {path!r}; this server answers GET "
                                   f"{HEALTH_PATH} and POST {SCORE_PATH}"))

    def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):   # the client gave up (its time-out)
            self.server.reward_server.log(f"HTTP {status} to {self.client_address[0]}: the "
                                          "client closed the connection first")

    def log_message(self, format: str, *args) -> None:   # noqa: A002 - the base class's name
        pass   # one line per scored batch or error instead (RewardServer.log)
