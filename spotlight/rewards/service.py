"""A reward computed by a reward service over HTTP: the protocol's encoding, and the client.

Protocol 1 (``docs/reward-service.md``): ``GET /health`` says which reward a server scores and
its limits; ``POST /v1/score`` takes one JSON batch ``{"protocol": 1, "reward": name, "images":
{"dtype", "shape", "data": base64}, "prompts": [...]}`` and answers ``{"protocol": 1, "reward":
name, "rewards": [...]}``; an error is ``{"protocol": 1, "error": {"code", "message"}}`` under a
4xx or 5xx status. The encoding functions are pure and shared by the client
(:class:`ServiceReward`, what ``build_reward`` returns when ``reward.service.url`` is set) and
the reference server (``spotlight serve-reward``).
"""
from __future__ import annotations

import base64
import binascii
import http.client
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import numpy as np

from spotlight.config import RewardConfig
from spotlight.config.reward_service import PIXEL_ENCODINGS
from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.rewards.batch import check_canvases

PROTOCOL = 1
HEALTH_PATH = "/health"
SCORE_PATH = "/v1/score"
MAX_BACKOFF_S = 30.0
_WIRE_DTYPES = {"float32": np.dtype("<f4"), "uint8": np.dtype("u1")}


class ProtocolError(ValueError):
    """A request or an answer that breaks the protocol. ``code`` is the error body's
    ``error.code`` and ``status`` the HTTP status a server answers it with."""

    def __init__(self, message: str, code: str = "bad_request", status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


class RewardServiceError(ValueError):
    """The reward service did not score a batch; the message names the URL, what came back and
    what to do. A ValueError, so the command line reports it as a setting to fix (exit 2)."""


# ---------------------------------------------------------------------------------- encoding


def encode_images(images: np.ndarray, pixels: str = "float32") -> dict:
    """(B, 3, H, W) floats in [0, 1] as the protocol's ``images`` object: little-endian
    C-order bytes in base64. ``uint8`` sends ``round(clip(x, 0, 1) * 255)``, the pixels the
    8-bit rewards read."""
    if pixels not in _WIRE_DTYPES:
        raise ValueError(f"pixels = {pixels!r}; choose one of {list(PIXEL_ENCODINGS)}")
    images = np.asarray(images, np.float32)
    if pixels == "uint8":
        array = (np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8)
    else:
        array = images.astype(_WIRE_DTYPES[pixels])
    data = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")
    return {"dtype": pixels, "shape": list(array.shape), "data": data}


def decode_images(obj: Any) -> np.ndarray:
    """The protocol's ``images`` object as (B, 3, H, W) float32 (``uint8`` divided by 255)."""
    if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
        raise ProtocolError("'images' must be an object with exactly the keys dtype, shape, data")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if dtype not in _WIRE_DTYPES:
        raise ProtocolError(f"'images.dtype' = {dtype!r}; choose one of {list(PIXEL_ENCODINGS)}")
    if not (isinstance(shape, list) and len(shape) == 4 and shape[1] == 3 and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise ProtocolError(f"'images.shape' = {shape!r} must be [B, 3, H, W] of counts "
                            "(RGB images, channels first)")
    if not isinstance(data, str):
        raise ProtocolError("'images.data' must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("'images.data' is not valid base64") from None
    wire = _WIRE_DTYPES[dtype]
    needed = math.prod(shape) * wire.itemsize
    if len(raw) != needed:
        raise ProtocolError(f"'images.data' holds {len(raw)} bytes, but shape {shape} of "
                            f"{dtype} needs {needed}")
    array = np.frombuffer(raw, wire).reshape(shape).astype(np.float32)   # a writable copy
    return array / np.float32(255) if dtype == "uint8" else array


def _clause_json(clause: ObjectClause) -> dict:
    out: dict = {"class": clause.cls, "count": clause.count}
    if clause.color is not None:
        out["color"] = clause.color
    if clause.position is not None:
        out["position"] = list(clause.position)
    return out


def encode_prompt(prompt: Prompt) -> dict:
    """A prompt as the protocol's JSON object (keys that are unset are left out)."""
    out: dict = {"text": prompt.text, "task": prompt.task}
    if prompt.target is not None:
        out["target"] = prompt.target
    if prompt.tag is not None:
        out["tag"] = prompt.tag
    if prompt.include:
        out["include"] = [_clause_json(c) for c in prompt.include]
    if prompt.exclude:
        out["exclude"] = [_clause_json(c) for c in prompt.exclude]
    return out


def _optional_str(obj: dict, key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"'{where}.{key}' must be a string or null, got {value!r:.60}")
    return value


def _decode_clause(obj: Any, where: str) -> ObjectClause:
    if not isinstance(obj, dict) or not {"class", "count"} <= set(obj) or \
            not set(obj) <= {"class", "count", "color", "position"}:
        raise ProtocolError(f"'{where}' must be an object with keys class, count and optionally "
                            "color, position")
    cls, count, position = obj["class"], obj["count"], obj.get("position")
    if not isinstance(cls, str) or not isinstance(count, int) or isinstance(count, bool) \
            or count < 0:
        raise ProtocolError(f"'{where}': class must be a string and count a count, got "
                            f"{cls!r:.40} and {count!r:.20}")
    if position is not None and not (
            isinstance(position, list) and len(position) == 2 and isinstance(position[0], str)
            and isinstance(position[1], int) and not isinstance(position[1], bool)):
        raise ProtocolError(f"'{where}.position' = {position!r:.60} must be [relation, index]")
    return ObjectClause(cls=cls, count=count, color=_optional_str(obj, "color", where),
                        position=None if position is None else (position[0], position[1]))


PROMPT_KEYS = ("text", "task", "target", "tag", "include", "exclude")


def decode_prompt(obj: Any, where: str = "prompts[0]") -> Prompt:
    """A prompt from the protocol's JSON object; a wrong key or type is a ProtocolError."""
    if not isinstance(obj, dict) or not {"text", "task"} <= set(obj) or \
            not set(obj) <= set(PROMPT_KEYS):
        raise ProtocolError(f"'{where}' must be an object with keys text, task and optionally "
                            "target, tag, include, exclude")
    if not isinstance(obj["text"], str) or not isinstance(obj["task"], str):
        raise ProtocolError(f"'{where}': text and task must be strings")
    clauses = {}
    for key in ("include", "exclude"):
        entries = obj.get(key, [])
        if not isinstance(entries, list):
            raise ProtocolError(f"'{where}.{key}' must be a list of objects")
        clauses[key] = tuple(_decode_clause(entry, f"{where}.{key}[{i}]")
                             for i, entry in enumerate(entries))
    return Prompt(text=obj["text"], task=obj["task"], target=_optional_str(obj, "target", where),
                  tag=_optional_str(obj, "tag", where), **clauses)


def encode_request(images: np.ndarray, prompts: Sequence[Prompt], reward: str,
                   pixels: str = "float32") -> bytes:
    """The body of ``POST /v1/score`` for a batch the reward named ``reward`` should score."""
    return json.dumps({"protocol": PROTOCOL, "reward": reward,
                       "images": encode_images(images, pixels),
                       "prompts": [encode_prompt(p) for p in prompts]}).encode()


@dataclass(frozen=True)
class ScoreRequest:
    """A decoded ``POST /v1/score`` body."""

    images: np.ndarray
    prompts: list[Prompt]
    reward: str | None


def _document(body: bytes, what: str) -> dict:
    """A JSON object of protocol ``PROTOCOL`` from ``body``, or a ProtocolError saying why not."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ProtocolError(f"{what} is not JSON (it starts {bytes(body[:80])!r})") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(doc).__name__}")
    version = doc.get("protocol")
    if version != PROTOCOL:
        raise ProtocolError(f"{what} is of protocol {version!r}, but this side speaks protocol "
                            f"{PROTOCOL}; run a server and a client of the same Spotlight "
                            "version (docs/reward-service.md)", code="protocol_version")
    return doc


def decode_request(body: bytes) -> ScoreRequest:
    """A ``POST /v1/score`` body as arrays and prompts; anything malformed is a ProtocolError."""
    doc = _document(body, "the request")
    unknown = set(doc) - {"protocol", "reward", "images", "prompts"}
    if unknown:
        raise ProtocolError(f"the request has unknown keys {sorted(unknown)}; allowed: protocol, "
                            "reward, images, prompts")
    reward = doc.get("reward")
    if reward is not None and not isinstance(reward, str):
        raise ProtocolError(f"'reward' must be a reward name (a string), got {reward!r:.60}")
    images = decode_images(doc.get("images"))
    entries = doc.get("prompts")
    if not isinstance(entries, list) or len(entries) != len(images):
        count = len(entries) if isinstance(entries, list) else "no list of"
        raise ProtocolError(f"'prompts' must list one prompt per image: {len(images)} images, "
                            f"{count} prompts")
    prompts = [decode_prompt(e, f"prompts[{i}]") for i, e in enumerate(entries)]
    return ScoreRequest(images=images, prompts=prompts, reward=reward)


def encode_rewards(values: np.ndarray, reward: str) -> bytes:
    """The ``200`` answer to a score request; NaN cannot be written (JSON has none)."""
    return json.dumps({"protocol": PROTOCOL, "reward": reward,
                       "rewards": [float(v) for v in np.asarray(values).reshape(-1)]},
                      allow_nan=False).encode()


def decode_rewards(body: bytes, count: int, reward: str) -> np.ndarray:
    """The rewards of a ``200`` answer as float64, checked: ``count`` finite numbers scored by
    the reward named ``reward``."""
    doc = _document(body, "the answer")
    if doc.get("reward", reward) != reward:
        raise ProtocolError(f"the answer was scored by reward {doc['reward']!r}, not {reward!r}")
    values = doc.get("rewards")
    if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ProtocolError(f"the answer's 'rewards' must be a list of numbers, got "
                            f"{values!r:.80}")
    if len(values) != count:
        raise ProtocolError(f"the answer holds {len(values)} rewards for a batch of {count} "
                            "images: the server drops or adds samples; check its log")
    out = np.asarray(values, np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        shown = ", ".join(f"{i}: {out[i]}" for i in bad[:10])
        raise ProtocolError(f"the answer's rewards of samples [{shown}] are not finite (a NaN "
                            "reward poisons its whole group); fix the server's scorer")
    return out


def error_body(code: str, message: str) -> bytes:
    """The body of an error answer."""
    return json.dumps({"protocol": PROTOCOL, "error": {"code": code, "message": message}}).encode()


def error_message(body: bytes) -> str:
    """What an error answer says: its ``code: message``, else the start of its raw body."""
    try:
        error = json.loads(body).get("error")
        return f"{error['code']}: {error['message']}"
    except (ValueError, AttributeError, TypeError, KeyError):
        text = body[:200].decode("utf-8", "replace").strip()
        return f"a body that is not a protocol error: {text!r}" if text else "an empty body"


@dataclass(frozen=True)
class Health:
    """What ``GET /health`` says: the reward served and the server's limits."""

    reward: str
    max_batch: int
    max_body_bytes: int
    recognizer_accuracy: float = float("nan")

    def to_json(self) -> bytes:
        accuracy = self.recognizer_accuracy
        return json.dumps({"protocol": PROTOCOL, "status": "ok", "reward": self.reward,
                           "max_batch": self.max_batch, "max_body_bytes": self.max_body_bytes,
                           "pixels": list(PIXEL_ENCODINGS),
                           "recognizer_accuracy": None if math.isnan(accuracy) else accuracy}
                          ).encode()


def decode_health(body: bytes) -> Health:
    doc = _document(body, "the /health answer")
    reward, batch, size = doc.get("reward"), doc.get("max_batch"), doc.get("max_body_bytes")
    accuracy = doc.get("recognizer_accuracy")
    if not isinstance(reward, str) or not all(isinstance(n, int) and not isinstance(n, bool)
                                              and n >= 1 for n in (batch, size)):
        raise ProtocolError(f"the /health answer needs 'reward' (a name) and 'max_batch', "
                            f"'max_body_bytes' (counts >= 1), got {doc!r:.200}")
    if accuracy is not None and not isinstance(accuracy, (int, float)):
        raise ProtocolError(f"the /health answer's 'recognizer_accuracy' = {accuracy!r:.40} must "
                            "be a number or null")
    return Health(reward, batch, size, float("nan") if accuracy is None else float(accuracy))


# ------------------------------------------------------------------------------------ client


def retry_delay(attempt: int, backoff_s: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry ``attempt + 1``: the server's Retry-After (seconds) when it
    sent one, else ``backoff_s`` doubled per attempt; at most :data:`MAX_BACKOFF_S`."""
    try:
        wait = float(retry_after) if retry_after is not None else backoff_s * 2 ** attempt
    except ValueError:   # an HTTP date: not worth parsing for a few seconds' wait
        wait = backoff_s * 2 ** attempt
    return min(max(wait, 0.0), MAX_BACKOFF_S)


def retryable(status: int) -> bool:
    """Whether an HTTP status may pass by itself: 429 (busy) and every 5xx."""
    return status == 429 or status >= 500


class _Transient(Exception):
    """One attempt failed in a way a retry may mend; ``advice`` is what to do if none does."""

    def __init__(self, what: str, advice: str, retry_after: str | None = None) -> None:
        super().__init__(what)
        self.advice, self.retry_after = advice, retry_after


class ServiceReward:
    """A ``RewardFn`` whose rewards a reward service computes (``reward.service.url``).

    It asks ``/health`` once when built (so a wrong URL or a server of another reward fails
    before a run starts), then sends each batch in chunks of at most the server's ``max_batch``
    images and ``max_body_bytes``. Every request waits ``timeout_s`` at most per read and is
    retried ``retries`` times, with doubling back-off, after a connection error, a time-out,
    429 or 5xx; any other 4xx and any malformed answer is an error at once.
    """

    def __init__(self, config: RewardConfig, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not config.service.url:
            raise ValueError("ServiceReward needs reward.service.url: the reward service's base "
                             "URL, e.g. http://10.0.0.5:8765")
        self.name = config.name
        self.settings = config.service
        self.url = config.service.url.rstrip("/")
        self._sleep = sleep
        self.health = self._ask("GET", HEALTH_PATH, None, decode_health)
        if self.health.reward != self.name:
            raise RewardServiceError(
                f"reward service {self.url} serves reward '{self.health.reward}', but "
                f"reward.name = '{self.name}'; start the server with --reward {self.name}, or "
                f"set reward.name: {self.health.reward}")

    @property
    def recognizer_accuracy(self) -> float:
        """The served reward's recogniser accuracy, as the server reports it (NaN: none)."""
        return self.health.recognizer_accuracy

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        images = np.asarray(images)
        check_canvases(images, prompts, self.name)
        if self.settings.pixels == "uint8":
            bad = np.flatnonzero(~np.isfinite(images.reshape(len(images), -1)).all(axis=1))
            if len(bad):
                raise ValueError(f"reward '{self.name}': canvases {bad[:10].tolist()} hold NaN or "
                                 "infinite pixels, which 8-bit pixels cannot carry")
        step = self.chunk_size(images.shape, prompts)
        parts = [self._score(images[i:i + step], prompts[i:i + step])
                 for i in range(0, len(images), step)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float64)

    def chunk_size(self, shape: tuple[int, ...], prompts: Sequence[Prompt]) -> int:
        """Images per request: the server's ``max_batch``, fewer where its body limit needs."""
        pixel_bytes = math.prod(shape[1:]) * _WIRE_DTYPES[self.settings.pixels].itemsize
        prompt_bytes = max((len(json.dumps(encode_prompt(p))) for p in prompts), default=0)
        per_image = 4 * (pixel_bytes + 2) // 3 + 4 + prompt_bytes + 2
        fits = (self.health.max_body_bytes - 1024) // per_image
        if fits < 1:
            raise RewardServiceError(
                f"reward service {self.url} takes at most {self.health.max_body_bytes} bytes per "
                f"request, but one image of shape {tuple(shape[1:])} encodes to about "
                f"{per_image} bytes; start the server with a larger --max-body-mb"
                + (", or set reward.service.pixels: uint8" if self.settings.pixels != "uint8"
                   else ""))
        return max(1, min(self.health.max_batch, fits))

    def _score(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        body = encode_request(images, prompts, self.name, self.settings.pixels)
        return self._ask("POST", SCORE_PATH, body,
                         lambda answer: decode_rewards(answer, len(images), self.name))

    def _ask(self, method: str, path: str, body: bytes | None, decode: Callable[[bytes], Any]):
        """``decode`` of the ``200`` answer to ``method path``, retried as the settings say."""
        where, attempts = self.url + path, self.settings.retries + 1
        for attempt in range(attempts):
            try:
                answer = self._attempt(method, path, body, where)
                break
            except _Transient as failure:
                if attempt + 1 == attempts:
                    tries = f"all {attempts} attempts" if attempts > 1 else "its only attempt"
                    raise RewardServiceError(
                        f"reward service {where}: {failure} on {tries} (reward.service.retries "
                        f"= {self.settings.retries}); {failure.advice}") from None
                self._sleep(retry_delay(attempt, self.settings.backoff_s, failure.retry_after))
        try:
            return decode(answer)
        except ProtocolError as err:
            raise RewardServiceError(f"reward service {where} answered HTTP 200, but {err}; is "
                                     "reward.service.url a Spotlight reward server "
                                     "(docs/reward-service.md)?") from None

    def _attempt(self, method: str, path: str, body: bytes | None, where: str) -> bytes:
        """One request: the ``200`` answer's body, a :class:`_Transient`, or an error."""
        parts = urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=self.settings.timeout_s)
        try:
            connection.request(method, parts.path + path, body=body,
                               headers={"Content-Type": "application/json",
                                        "Accept": "application/json"})
            response = connection.getresponse()
            status, answer = response.status, response.read()
            retry_after = response.getheader("Retry-After")
        except TimeoutError:
            raise _Transient(f"no answer within reward.service.timeout_s = "
                             f"{self.settings.timeout_s:g} s",
                             "the server may be overloaded or the batch too big for it: raise "
                             "reward.service.timeout_s, or start it with a smaller --max-batch") \
                from None
        except (OSError, http.client.HTTPException) as err:
            raise _Transient(f"the connection failed ({type(err).__name__}: {err})",
                             "check that 'spotlight serve-reward' runs there and that "
                             "reward.service.url names its host and port") from None
        finally:
            connection.close()
        if status == 200:
            return answer
        message = error_message(answer)
        if retryable(status):
            raise _Transient(f"HTTP {status} ({message})", "see the reward server's log",
                             retry_after)
        raise RewardServiceError(f"reward service {where} refused the request with HTTP {status} "
                                 f"({message}); not retried, as a 4xx does not pass by itself: "
                                 "fix what it names (docs/reward-service.md)")
