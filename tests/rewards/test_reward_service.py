"""The reward service on loopback: protocol, reference server (`spotlight serve-reward`, in a
thread and as a subprocess), and the client reward's time-outs, retries and errors."""
from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pipelines.front.cli import main as cli_main
from pipelines.front.reward_http import RewardServer, build_served_reward, is_loopback
from spotlight.config import ConfigError, RewardConfig, load_config
from spotlight.config.reward_service import RewardServiceConfig
from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.models.world import random_ocr_prompt, render_ocr
from spotlight.rewards import build_reward
from spotlight.rewards.recognizer import DigitNet, recognizer_dir
from spotlight.rewards.service import (
    PROTOCOL,
    Health,
    ProtocolError,
    RewardServiceError,
    ServiceReward,
    decode_images,
    decode_prompt,
    decode_request,
    encode_images,
    encode_prompt,
    encode_request,
    encode_rewards,
    error_body,
    retry_delay,
)
from spotlight.rewards.text_ocr import RapidOcrEngine, TextOcrReward
from tests.rewards.test_text_ocr import prompt as ocr_text_prompt
from tests.rewards.test_text_ocr import rendered

# A recogniser no other test uses, written to the cache untrained: no training, and its soft
# outputs give `ocr-dense` rewards that move with every pixel (a strict comparison).
EPOCHS, SEED = 1, 4242
OCR = Prompt('a sign that says "407"', "ocr", target="407")
GENEVAL = Prompt("two red 3s left of a 5", "geneval", tag="position",
                 include=(ObjectClause("3", 2, "red"), ObjectClause("5", 1, None, ("left of", 0))),
                 exclude=(ObjectClause("7", 1),))


def service(url: str, name: str = "ocr", **settings) -> RewardConfig:
    return RewardConfig(name=name, recognizer_epochs=EPOCHS, recognizer_seed=SEED,
                        service=RewardServiceConfig(url=url, **settings))


@pytest.fixture
def untrained_recognizer(reward_cache: Path) -> Path:
    path = recognizer_dir(EPOCHS, SEED)
    if not (path / "meta.json").is_file():
        torch.manual_seed(SEED)
        path.mkdir(parents=True, exist_ok=True)
        save_file(DigitNet().state_dict(), str(path / "weights.safetensors"))
        (path / "meta.json").write_text(json.dumps({"accuracy": 0.25, "train_seconds": 0.0}))
    return path


def digit_canvases(count: int) -> tuple[np.ndarray, list[Prompt]]:
    rng = np.random.default_rng(7)
    prompts = [random_ocr_prompt(rng) for _ in range(count)]
    return np.stack([render_ocr(p.target, 12, 32, rng) for p in prompts]), prompts


# ------------------------------------------------------------------------------- protocol


def test_images_and_prompts_cross_the_wire_unchanged():
    images = np.random.default_rng(0).random((2, 3, 5, 4), dtype=np.float32)
    assert np.array_equal(decode_images(encode_images(images)), images)
    eight_bit = decode_images(encode_images(images, "uint8"))
    assert np.array_equal((eight_bit * 255).round(), (images * 255).round())
    for prompt in (OCR, GENEVAL):
        assert decode_prompt(json.loads(json.dumps(encode_prompt(prompt)))) == prompt
    request = decode_request(encode_request(images, [OCR, GENEVAL], "ocr"))
    assert request.reward == "ocr" and request.prompts == [OCR, GENEVAL]
    assert np.array_equal(request.images, images)


def _body(**changes) -> bytes:
    doc = json.loads(encode_request(np.zeros((1, 3, 2, 2), np.float32), [OCR], "ocr"))
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("body, code, says", [
    (b"<html>", "bad_request", "not JSON"),
    (_body(protocol=2), "protocol_version", "protocol 2, but this side speaks protocol 1"),
    (_body(images={"dtype": "float64", "shape": [1, 3, 2, 2], "data": ""}), "bad_request",
     "images.dtype"),
    (_body(images={"dtype": "uint8", "shape": [1, 3, 2, 2], "data": "AAAA"}), "bad_request",
     "holds 3 bytes, but shape"),
    (_body(prompts=[]), "bad_request", "1 images, 0 prompts"),
    (_body(prompts=[{"text": "x"}]), "bad_request", "prompts[0]"),
    (_body(extra=1), "bad_request", "unknown keys ['extra']"),
])
def test_malformed_requests_are_refused_saying_what(body, code, says):
    with pytest.raises(ProtocolError, match=re.escape(says)) as err:
        decode_request(body)
    assert err.value.code == code and err.value.status == 400


def test_retry_waits_double_and_a_servers_retry_after_wins():
    assert [retry_delay(a, 0.5) for a in range(3)] == [0.5, 1.0, 2.0]
    assert retry_delay(0, 0.5, "3") == 3.0 and retry_delay(9, 1.0) == 30.0


# ------------------------------------------------------------------- the reference server


def test_served_digits_reward_equals_in_process(untrained_recognizer, tmp_path, monkeypatch):
    """`spotlight serve-reward` as a subprocess, its reward section from a run config (whose
    own reward.service the server ignores); batches are split to the server's max batch."""
    config = tmp_path / "run.yaml"
    config.write_text(f"reward:\n  name: ocr\n  recognizer_epochs: {EPOCHS}\n  recognizer_seed: "
                      f"{SEED}\n  service:\n    url: http://127.0.0.1:9\n")
    assert load_config(config).reward.service.url == "http://127.0.0.1:9"
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))   # the same arithmetic
    command = [sys.executable, "-c", "import sys; from spotlight import main; "
               "sys.exit(main(sys.argv[1:]))", "serve-reward", "--config", str(config),
               "--reward", "ocr-dense", "--port", "0", "--max-batch", "3"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("serving"):
            line = server.stdout.readline()
            assert line, f"serve-reward ended: {server.stderr.read()}"
        url = line.split(" on ")[1].split()[0]
        client = build_reward(service(url, "ocr-dense"))
        assert isinstance(client, ServiceReward) and client.health.max_batch == 3
        images, prompts = digit_canvases(7)
        local = build_reward(service("", "ocr-dense"))
        assert client.recognizer_accuracy == local.recognizer_accuracy == 0.25
        served = client(images, prompts)
        # Bit for bit on the server's batches of 3; the float32 recogniser itself moves by ~1e-9
        # between batch sizes, in process too.
        assert np.array_equal(served, np.concatenate(
            [local(images[i:i + 3], prompts[i:i + 3]) for i in range(0, 7, 3)]))
        expected = local(images, prompts)
        assert len(set(expected.tolist())) > 3   # rewards that tell the canvases apart
        np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def ocr_text_reward():
    return TextOcrReward(RewardConfig(name="ocr-text"), engine=RapidOcrEngine())


def test_served_ocr_reward_equals_in_process_in_both_pixel_encodings(ocr_text_reward):
    # Narrow images: PP-OCR's detector scales the short side up to 736 pixels, so a wide strip
    # costs seconds a read.
    images = np.stack([rendered("875", width=112), rendered("8751", width=112)])
    prompts = [ocr_text_prompt("875"), ocr_text_prompt("8752")]
    expected = ocr_text_reward(images, prompts)
    assert expected.tolist() == [1.0, 0.75]
    with RewardServer(ocr_text_reward, max_batch=1) as server:
        for pixels in ("float32", "uint8"):
            client = build_reward(service(server.url, "ocr-text", pixels=pixels))
            assert np.array_equal(client(images, prompts), expected), pixels
            assert np.isnan(client.recognizer_accuracy)


class Constant:
    """A reward of 0.5 for every image of the 'ocr' family."""

    name, recognizer_accuracy = "ocr", 0.9

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()

    def __call__(self, images, prompts):
        if any(p.task != "ocr" for p in prompts):
            raise ValueError("reward 'ocr' scores 'ocr' prompts")
        self.release.wait(10)
        return np.full(len(images), 0.5)


def _post(url: str, path: str, body: bytes | None, method: str = "POST",
          headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_the_server_answers_each_fault_with_its_status_and_code():
    images = np.zeros((3, 3, 2, 2), np.float32)
    with RewardServer(Constant(), max_batch=2, max_body_bytes=4096) as server:
        status, health = _post(server.url, "/health", None, "GET")
        assert status == 200 and health["reward"] == "ocr" and health["max_batch"] == 2
        cases = [(_post(server.url, "/v1/score", encode_request(images[:1], [OCR], "ocr")), 200,
                  None),
                 (_post(server.url, "/v2/score", b"{}"), 404, "not_found"),
                 (_post(server.url, "/v1/score", None, "GET"), 405, "method_not_allowed"),
                 (_post(server.url, "/v1/score", b"{"), 400, "bad_request"),
                 (_post(server.url, "/v1/score", encode_request(images[:1], [OCR], "geneval")),
                  409, "wrong_reward"),
                 (_post(server.url, "/v1/score", encode_request(images, [OCR] * 3, "ocr")),
                  413, "batch_too_large"),
                 (_post(server.url, "/v1/score", b" " * 5000), 413, "body_too_large"),
                 (_post(server.url, "/v1/score", encode_request(images[:1], [GENEVAL], "ocr")),
                  422, "unprocessable")]
    for (status, doc), want, code in cases:
        assert status == want and doc["protocol"] == PROTOCOL, doc
        if code is None:
            assert doc["rewards"] == [0.5]
        else:
            assert doc["error"]["code"] == code and doc["error"]["message"], doc


def test_a_full_queue_is_answered_503_with_retry_after():
    reward = Constant()
    reward.release.clear()
    server = RewardServer(reward, max_waiting=0)
    body = encode_request(np.zeros((1, 3, 2, 2), np.float32), [OCR], "ocr")
    first = threading.Thread(target=server.score, args=(body,))
    first.start()
    try:
        while server._active == 0:
            time.sleep(0.01)
        status, answer, headers = server.score(body)
        assert status == 503 and json.loads(answer)["error"]["code"] == "busy"
        assert headers == {"Retry-After": "1"}
    finally:
        reward.release.set()
        first.join()
        server.close()


def test_serve_reward_takes_only_reward_settings(capsys, untrained_recognizer):
    assert cli_main(["serve-reward", "--set", "grpo.lr=0.1"]) == 2
    assert "only reward.* settings" in capsys.readouterr().err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    served = build_served_reward(service("http://10.0.0.5:1", "ocr"))   # not a client of itself
    assert served.name == "ocr" and not isinstance(served, ServiceReward)


# ----------------------------------------------------------------- the client's fault paths


class Scripted:
    """A stand-in server: scripted (status, body, headers, delay) answers to POST /v1/score,
    then good ones (0.5 per image)."""

    def __init__(self, script=(), health: Health = Health("ocr", 64, 2**20)) -> None:
        self.script, self.posts, self.health = list(script), 0, health
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.answer(200, owner.health.to_json(), {})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.posts += 1
                if owner.script:
                    status, answer, headers, delay = owner.script.pop(0)
                    time.sleep(delay)
                else:
                    count = len(decode_request(body).images)
                    status, answer, headers = 200, encode_rewards(np.full(count, 0.5), "ocr"), {}
                self.answer(status, answer, headers)

            def answer(self, status: int, body: bytes, headers: dict) -> None:
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass   # the client timed out and left

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> "Scripted":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def client(url: str, sleeps: list | None = None, **settings) -> ServiceReward:
    settings = {"backoff_s": 0.25, **settings}
    return ServiceReward(service(url, **settings),
                         sleep=(sleeps.append if sleeps is not None else time.sleep))


ONE = (np.zeros((1, 3, 12, 32), np.float32), [OCR])


def test_a_transient_503_is_retried_after_its_retry_after():
    sleeps: list = []
    with Scripted([(503, error_body("busy", "queue full"), {"Retry-After": "0"}, 0.0)]) as bad:
        assert client(bad.url, sleeps)(*ONE).tolist() == [0.5]
    assert bad.posts == 2 and sleeps == [0.0]


def test_a_time_out_is_retried_then_reported():
    with Scripted([(200, b"", {}, 1.0)] * 2) as slow:
        with pytest.raises(RewardServiceError, match=r"/v1/score: no answer within reward.service"
                           r".timeout_s = 0.3 s on all 2 attempts.*raise reward.service.timeout_s"):
            client(slow.url, [], timeout_s=0.3, retries=1)(*ONE)
        assert slow.posts == 2


def test_server_errors_use_up_the_retries_with_doubling_waits():
    sleeps: list = []
    with Scripted([(500, error_body("internal", "CUDA out of memory"), {}, 0.0)] * 3) as bad:
        with pytest.raises(RewardServiceError, match="HTTP 500 .internal: CUDA out of memory. "
                           "on all 3 attempts.*server's log"):
            client(bad.url, sleeps, retries=2)(*ONE)
    assert bad.posts == 3 and sleeps == [0.25, 0.5]


def test_a_4xx_is_not_retried():
    refusal = error_body("unprocessable", "prompts [0] are 'geneval'")
    with Scripted([(422, refusal, {}, 0.0)]) as bad:
        with pytest.raises(RewardServiceError, match=r"refused the request with HTTP 422 "
                           r"\(unprocessable: prompts \[0\] are 'geneval'\); not retried"):
            client(bad.url, [])(*ONE)
        assert bad.posts == 1


def _answer(**doc) -> bytes:
    return json.dumps({"protocol": PROTOCOL, "reward": "ocr", **doc}).encode()


@pytest.mark.parametrize("answer, says", [
    (b"<html>Bad gateway</html>", "is not JSON"),
    (_answer(rewards=[0.5, 0.5]), "holds 2 rewards for a batch of 1 images"),
    (_answer(rewards=[float("nan")]), r"rewards of samples \[0: nan\] are not finite"),
    (_answer(protocol=2, rewards=[0.5]), "protocol 2, but this side speaks protocol 1"),
    (_answer(rewards="0.5"), "'rewards' must be a list of numbers"),
    (_answer(reward="geneval", rewards=[0.5]), "scored by reward 'geneval', not 'ocr'"),
])
def test_a_malformed_answer_is_an_error_naming_the_url(answer, says):
    with Scripted([(200, answer, {}, 0.0)]) as bad:
        with pytest.raises(RewardServiceError, match=f"reward service {bad.url}/v1/score answered "
                           f"HTTP 200, but .*{says}.*Spotlight reward server") as err:
            client(bad.url, [])(*ONE)
        assert bad.posts == 1, err.value


def test_batches_are_split_to_the_servers_body_limit():
    health = Health("ocr", 64, 1024 + 2 * (4 * 3 * 12 * 32 * 4 // 3 + 200))
    with Scripted(health=health) as small:
        rewards = client(small.url)(np.zeros((5, 3, 12, 32), np.float32), [OCR] * 5)
        assert rewards.tolist() == [0.5] * 5 and small.posts == 3
        with pytest.raises(RewardServiceError, match="larger --max-body-mb, or set reward.serv"):
            client(small.url)(np.zeros((1, 3, 64, 64), np.float32), [OCR])


def test_the_wrong_reward_or_no_server_fails_when_the_reward_is_built():
    with Scripted(health=Health("geneval", 64, 2**20)) as other:
        with pytest.raises(RewardServiceError, match="serves reward 'geneval', but reward.name = "
                           "'ocr'; start the server with --reward ocr"):
            client(other.url)
        closed = other.url
    with pytest.raises(RewardServiceError, match=re.escape(f"{closed}/health: the connection "
                       "failed") + ".* on all 2 attempts.*'spotlight serve-reward' runs there"):
        client(closed, [], retries=1)


def test_the_service_is_chosen_by_config_and_checked(tmp_path, untrained_recognizer):
    assert not isinstance(build_reward(service("", "ocr")), ServiceReward)   # the default
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  service: http://127.0.0.1:8765\n")
    with pytest.raises(ConfigError, match="'reward.service' must be a mapping"):
        load_config(config)
    for url, says in [("ftp://h", "http:// or https://"), ("http://h?x=1", "query"),
                      ("http://h:99999", "invalid port")]:
        with pytest.raises(ConfigError, match=re.escape(f"url = '{url}'") + f".*{says}"):
            RewardServiceConfig(url=url)
