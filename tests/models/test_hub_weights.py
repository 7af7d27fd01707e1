"""Qwen-Image weights named by a Hugging Face Hub id, fetched through huggingface_hub as
``from_pretrained`` would -- from a loopback Hub (127.0.0.1) serving tiny random components in the
real file format, or offline from a cache ``hf download`` filled. Nothing reaches a real Hub.

huggingface_hub reads ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and its cache folders when it is
imported, so every resolution runs in a fresh process with those set, as a user's worker does;
that process can reach nothing but the loopback Hub (other traffic goes to a closed proxy port).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch

from spotlight.config import PROJECT_ROOT
from spotlight.models.hub import parse_hub_id
from spotlight.models.qwen_image.weights import TINY, load_components, local_folder

TOKEN = "hf_loopback_token"


class LoopbackHub:
    """The Hub endpoints ``snapshot_download`` and ``hf download`` call -- revision info, the
    recursive tree, HEAD/GET of ``resolve`` with ETag, X-Repo-Commit and Content-Length -- over
    repos held in memory. ``*.safetensors`` files are LFS files (ETag = sha256), the others plain
    git blobs (ETag = git sha1), as on the Hub; a gated repo serves files only for ``TOKEN``."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.hub = self
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, files: dict[str, bytes], refs: tuple[str, ...] = ("main",),
            gated: bool = False) -> str:
        """Serve ``files`` as a commit of ``repo`` that ``refs`` point to; its commit id."""
        listing = "".join(f"{path}:{hashlib.sha256(data).hexdigest()}\n"
                          for path, data in sorted(files.items()))
        commit = hashlib.sha1(f"{repo}\n{listing}".encode()).hexdigest()
        entry = self.repos.setdefault(repo, {"commits": {}, "refs": {}, "gated": gated})
        entry["commits"][commit] = files
        entry["refs"].update({ref: commit for ref in refs})
        return commit

    def fetched(self, repo: str) -> list[str]:
        """The files of ``repo`` whose bytes were sent (GET of resolve)."""
        return [path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path in self.requests
                if method == "GET" and path.startswith(f"/{repo}/resolve/")]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(send_body=False)

    def do_GET(self):
        self._serve(send_body=True)

    def _serve(self, send_body: bool) -> None:
        hub: LoopbackHub = self.server.hub
        raw = urlsplit(self.path).path
        hub.requests.append((self.command, unquote(raw)))
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", raw)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", raw)
        match = api or resolve
        if match is None:
            return self._send(404, {}, b"", send_body)
        repo, revision = unquote(match[1]), unquote(match[3] if api else match[2])
        if repo not in hub.repos:
            return self._send(404, {"X-Error-Code": "RepoNotFound"}, b"", send_body)
        entry = hub.repos[repo]
        commit = entry["refs"].get(revision, revision)
        if commit not in entry["commits"]:
            return self._send(404, {"X-Error-Code": "RevisionNotFound"}, b"", send_body)
        files = entry["commits"][commit]
        if api and match[2] == "revision":
            info = {"id": repo, "sha": commit, "private": False,
                    "gated": entry["gated"] and "manual",
                    "siblings": [{"rfilename": p} for p in sorted(files)]}
            return self._send(200, {}, json.dumps(info).encode(), send_body)
        if api:
            return self._send(200, {}, json.dumps(_tree(files)).encode(), send_body)
        name = unquote(resolve[3])
        if entry["gated"] and self.headers.get("authorization") != f"Bearer {TOKEN}":
            status = 403 if self.headers.get("authorization") else 401
            return self._send(status, {"X-Error-Code": "GatedRepo", "X-Error-Message":
                                       f"Access to model {repo} is restricted."}, b"", send_body)
        if name not in files:
            return self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit},
                              b"", send_body)
        data = files[name]
        return self._send(200, {"X-Repo-Commit": commit, "ETag": f'"{_etag(name, data)}"'},
                          data, send_body)

    def _send(self, status: int, headers: dict, data: bytes, send_body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.wfile.write(data)


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _etag(name: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else _git_sha1(data)


def _tree(files: dict[str, bytes]) -> list[dict]:
    folders = sorted({str(Path(p).parent) for p in files} - {"."})
    out = [{"type": "directory", "oid": "0" * 40, "path": f} for f in folders]
    for path, data in sorted(files.items()):
        item = {"type": "file", "oid": _git_sha1(data), "size": len(data), "path": path}
        if path.endswith(".safetensors"):
            item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                           "pointerSize": 134}
        out.append(item)
    return out


# Resolving weights needs no torch (weights.py imports it to load them): a stand-in module
# spares each process the seconds a torch import takes; any use of it would fail loudly.
RESOLVE = """
import json, sys, types
sys.modules["torch"] = types.ModuleType("torch")
from spotlight.models.qwen_image.weights import local_folder
out = []
for arg in sys.argv[1:]:
    try:
        out.append(str(local_folder(arg.removeprefix("configs:"),
                                    configs_only=arg.startswith("configs:"))))
    except ValueError as err:
        out.append(f"{type(err).__name__}: {err}")
print(json.dumps(out))
"""


def _env(root: Path, hub: LoopbackHub, **extra: str) -> dict[str, str]:
    """A worker's environment: its own Hub and Spotlight caches, the loopback Hub as
    HF_ENDPOINT, and a closed proxy for anything else."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HF_") and k.lower() not in
           {"transformers_offline", "http_proxy", "https_proxy", "all_proxy", "no_proxy"}}
    closed = "http://127.0.0.1:9"
    env.update(HF_HOME=str(root / "hf-home"), HF_HUB_CACHE=str(root / "hub-cache"),
               SPOTLIGHT_CACHE=str(root / "spotlight"), HF_ENDPOINT=hub.url,
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_UPDATE_CHECK="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", PYTHONPATH=str(PROJECT_ROOT),
               HTTP_PROXY=closed, HTTPS_PROXY=closed, ALL_PROXY=closed,
               http_proxy=closed, https_proxy=closed, all_proxy=closed,
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(extra)
    return env


def _resolve(env: dict, cwd: Path, *weights: str) -> list[str]:
    """``local_folder`` of each of ``weights`` in a fresh process: a folder, or the error."""
    done = subprocess.run([sys.executable, "-c", RESOLVE, *weights], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hf_download(env: dict, cwd: Path, repo: str, revision: str) -> None:
    """What the offline error tells a user to run, against the loopback Hub."""
    hf = Path(sys.executable).parent / "hf"
    done = subprocess.run([str(hf), "download", repo, "--revision", revision], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hub():
    """The loopback Hub: ``tiny/qwen-image`` with ``main`` (commit B, a changed scheduler
    config) and tag ``v1`` (commit A), a gated copy, plain copies, and a repo without a VAE."""
    a = _files(local_folder(TINY))
    b = dict(a)
    scheduler = json.loads(a["scheduler/scheduler_config.json"])
    b["scheduler/scheduler_config.json"] = json.dumps({**scheduler, "shift": 2.5}).encode()
    server = LoopbackHub()
    server.commit_a = server.add("tiny/qwen-image", a, refs=("v1",))
    server.commit_b = server.add("tiny/qwen-image", b, refs=("main",))
    server.files_a, server.files_b = a, b
    server.add("gated/qwen-image", a, gated=True)
    server.add("copy/qwen-image", a)
    server.add("configs/qwen-image", a)
    server.add("other/not-qwen", {k: v for k, v in a.items() if not k.startswith("vae/")})
    yield server
    server.close()


@pytest.fixture(scope="module")
def online(hub, tmp_path_factory):
    """One worker's first start on a machine with a network: every kind of Hub id at once."""
    root = tmp_path_factory.mktemp("online")
    local = root / "local" / "qwen-image"            # a folder named like a Hub id
    shutil.copytree(local_folder(TINY), local)
    env = _env(root, hub)
    hub.requests.clear()
    ids = ["tiny/qwen-image", "tiny/qwen-image@v1", f"tiny/qwen-image@{hub.commit_a}",
           "copy/qwen-image", "configs:configs/qwen-image", "local/qwen-image",
           "nobody/nothing", "tiny/qwen-image@no-such-branch", "gated/qwen-image",
           "other/not-qwen"]
    results = dict(zip(ids, _resolve(env, root, *ids)))
    return root, env, results, list(hub.requests)


def test_a_hub_id_is_the_snapshot_of_its_revision_in_the_standard_cache(hub, online):
    root, _, results, _ = online
    snapshots = root / "hub-cache" / "models--tiny--qwen-image" / "snapshots"
    assert results["tiny/qwen-image"] == str(snapshots / hub.commit_b)
    assert results["tiny/qwen-image@v1"] == str(snapshots / hub.commit_a)
    assert results[f"tiny/qwen-image@{hub.commit_a}"] == str(snapshots / hub.commit_a)
    assert _files(Path(results["tiny/qwen-image"])) == hub.files_b
    assert _files(Path(results["tiny/qwen-image@v1"])) == hub.files_a
    assert hub.files_a != hub.files_b
    # checksummed and recorded once per machine: each file's sha256 and size
    records = [json.loads(p.read_text()) for p in (root / "spotlight" / "hub").glob("*.json")]
    tiny_v1 = next(r for r in records
                   if r["repo"] == "tiny/qwen-image" and r["revision"] == "v1")
    assert tiny_v1["commit"] == hub.commit_a and tiny_v1["endpoint"] == hub.url
    assert {n: f["sha256"] for n, f in tiny_v1["files"].items()} == \
        {n: hashlib.sha256(b).hexdigest() for n, b in hub.files_a.items()}
    # a file two revisions share is sent once
    assert sorted(hub.fetched("tiny/qwen-image")) == \
        sorted([*hub.files_b, "scheduler/scheduler_config.json"])


def test_the_snapshot_loads_like_a_folder(hub, online):
    folder = online[2]["tiny/qwen-image@v1"]
    components = load_components(folder, torch.float32)
    expected = load_components(str(local_folder(TINY)), torch.float32)
    for got, want in ((components.transformer, expected.transformer),
                      (components.text_encoder, expected.text_encoder)):
        assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(),
                                                     want.state_dict().values()))


def test_a_folder_of_the_same_name_wins_and_the_check_fetches_only_configs(hub, online):
    _, _, results, requests = online
    assert results["local/qwen-image"] == "local/qwen-image"
    assert not [path for _, path in requests if "local" in path]
    configs = Path(results["configs:configs/qwen-image"])
    assert sorted(_files(configs)) == sorted(n for n in hub.files_a if n.endswith(".json"))
    assert not [n for n in hub.fetched("configs/qwen-image") if n.endswith(".safetensors")]


def test_a_bad_hub_id_says_what_is_wrong_and_what_to_do(hub, online):
    root, _, results, _ = online
    assert re.fullmatch(r"HubError: model.weights 'nobody/nothing' \(Hub repo 'nobody/nothing' at "
                        r"revision 'main' on http://127.0.0.1:\d+\): no such repo \(a private one "
                        r".*HF_TOKEN.*\), and no folder 'nobody/nothing' in "
                        + re.escape(str(root)), results["nobody/nothing"])
    assert "the repo has no revision 'no-such-branch'" in results["tiny/qwen-image@no-such-branch"]
    gated = results["gated/qwen-image"]
    assert re.search(r"the repo is gated and no token is set; accept its conditions at "
                     r"http://127.0.0.1:\d+/gated/qwen-image .*set HF_TOKEN", gated), gated
    assert re.search(r"WeightsError: model.weights 'other/not-qwen' lacks \['vae/config.json'\]",
                     results["other/not-qwen"])
    # refused from its configs, before any weight moved
    assert not [n for n in hub.fetched("other/not-qwen") if n.endswith(".safetensors")]


def test_a_token_opens_a_gated_repo(hub, tmp_path):
    env = _env(tmp_path, hub)
    wrong = _resolve({**env, "HF_TOKEN": "hf_wrong"}, tmp_path, "gated/qwen-image")[0]
    assert re.search(r"the repo is gated and the token set \(HF_TOKEN or `hf auth login`\) has "
                     r"no access to it; accept its conditions", wrong), wrong
    snapshot = tmp_path / "hub-cache" / "models--gated--qwen-image" / "snapshots"
    folder = _resolve({**env, "HF_TOKEN": TOKEN}, tmp_path, "gated/qwen-image")[0]
    assert folder == str(next(snapshot.iterdir()))
    assert _files(Path(folder)) == hub.files_a


def test_a_later_start_makes_no_request_and_refuses_a_damaged_file(hub, online):
    root, env, results, _ = online
    damaged = Path(results["copy/qwen-image"]) / "vae" / "diffusion_pytorch_model.safetensors"
    blob = damaged.resolve()
    blob.write_bytes(blob.read_bytes()[:-10])             # truncated behind the snapshot's link
    hub.requests.clear()
    again = _resolve(env, root, "tiny/qwen-image", "tiny/qwen-image@v1", "copy/qwen-image")
    assert again[:2] == [results["tiny/qwen-image"], results["tiny/qwen-image@v1"]]
    assert re.fullmatch(r"HubError: model.weights 'copy/qwen-image': the cached snapshot .* is "
                        r"damaged \(vae/diffusion_pytorch_model.safetensors\); fetch it again "
                        r"with `hf download copy/qwen-image --revision [0-9a-f]{40} "
                        r"--force-download`", again[2])
    assert hub.requests == []


def test_offline_a_prefetched_cache_serves_and_a_missing_one_says_how_to_fetch(hub, tmp_path):
    env = _env(tmp_path, hub)
    _hf_download(env, tmp_path, "tiny/qwen-image", "v1")
    _hf_download(env, tmp_path, "copy/qwen-image", "main")
    cache = tmp_path / "hub-cache"
    corrupt = cache / "models--copy--qwen-image" / "snapshots"
    corrupt = next(corrupt.iterdir()) / "transformer" / "diffusion_pytorch_model.safetensors"
    data = bytearray(corrupt.read_bytes())
    data[-1] ^= 0xFF                                      # same size, other bytes
    corrupt.resolve().write_bytes(bytes(data))
    hub.requests.clear()
    got = _resolve({**env, "HF_HUB_OFFLINE": "1"}, tmp_path,
                   "tiny/qwen-image@v1", "tiny/qwen-image", "copy/qwen-image")
    assert got[0] == str(cache / "models--tiny--qwen-image" / "snapshots" / hub.commit_a)
    assert _files(Path(got[0])) == hub.files_a
    assert re.fullmatch(r"HubError: model.weights 'tiny/qwen-image' .*: HF_HUB_OFFLINE is set "
                        r"and the Hugging Face cache " + re.escape(str(cache)) + r" holds no "
                        r"complete snapshot of it; fetch it on this machine first with `hf "
                        r"download tiny/qwen-image --revision main` .*", got[1])
    assert re.search(r"\['transformer/diffusion_pytorch_model.safetensors'\] do not match the "
                     r"checksums the Hub gave them", got[2]), got[2]
    assert hub.requests == []                              # offline: not one request


@pytest.mark.parametrize("weights, expected", [
    ("Qwen/Qwen-Image", ("Qwen/Qwen-Image", "main")),
    ("Qwen/Qwen-Image@v1.0", ("Qwen/Qwen-Image", "v1.0")),
    ("Qwen/Qwen-Image@refs/pr/12", ("Qwen/Qwen-Image", "refs/pr/12")),
    ("tiny", None), ("weights", None), ("./Qwen/Qwen-Image", None), ("/models/qwen", None),
    ("~/Qwen/Qwen-Image", None), ("s3://bucket/qwen", None), ("file:///models/q", None),
    ("a/b/c", None), ("org/na--me", None), ("org/..", None)])
def test_what_counts_as_a_hub_id(weights, expected):
    assert parse_hub_id(weights) == expected
