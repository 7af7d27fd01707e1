"""``spotlight audit RUN_URL``: the table, one request's strip, and clear errors (file:// and s3://)."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from spotlight import main
from spotlight.models.policy import unpack
from spotlight.models.world import to_pixels
from storage import RunStore, StorageConfig

H, W = 12, 32
TOKENS, CHANNELS = (H // 2) * (W // 2), 12
BATCH, STEPS = 2, 3


def build_run(target, *, canvas: bool = True) -> tuple[RunStore, np.ndarray]:
    """Iteration 0: a streamed rollout request (a batch of 2 canvases), rewards, two stage
    records; iteration 1: a validation record."""
    store = RunStore.open(target)
    if canvas:
        store.record_run(config={"world": {"canvas_height": H, "canvas_width": W}})
    rng = np.random.default_rng(0)
    lats = np.stack([rng.uniform(-1, 1, (BATCH, TOKENS, CHANNELS)).astype(np.float32)
                     for _ in range(STEPS + 1)])
    with store.latent_sink("iter-0/rollout") as sink:
        for t, latent in enumerate(lats):
            sink.commit("req-7", t, latent, num_steps=STEPS, weights_version=0)
    store.append_rewards(0, {"prompt": ["p0", "p1"], "seed": [1, 2], "stage": "rollout",
                             "reward": [0.5, 1.5], "weights_version": 0})
    store.mark_stage_done("iter-0/rollout", {"requests": 1, "preemptions": 2})
    store.mark_stage_done("iter-1/validation")
    return store, lats


def test_audit_prints_the_table(tmp_path, capsys):
    store, _ = build_run(f"file://{tmp_path}/run")
    assert main(["audit", store.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["iter", "explore", "rollout", "validation"]
    row0 = lines[2].split()
    assert row0[0] == "0" and "1.000±0.500" in lines[2] and "1/1" in row0 and "2" in row0
    assert lines[3].split()[0] == "1" and lines[3].rstrip().endswith("validation")


def test_audit_events_prints_the_event_log_in_time_order(tmp_path, capsys):
    store, _ = build_run(f"file://{tmp_path}/run")
    assert main(["audit", store.url, "--events"]) == 0
    assert "no events recorded" in capsys.readouterr().out
    store.write_events("iter-000000-x", [
        {"kind": "request", "what": "requeued", "at": 1795400001.5, "stage": "iter-1/explore",
         "worker": "spot-2", "request": "p0003-c0000", "step": 7, "hard": True},
        {"kind": "injector", "what": "kill", "at": 1795400001.0, "worker": "spot-2", "pid": 4242}])
    assert main(["audit", store.url, "--events"]) == 0
    lines = capsys.readouterr().out.splitlines()[-2:]
    assert "injector/kill" in lines[0] and "worker=spot-2" in lines[0]
    assert "request/requeued" in lines[1] and "step=7" in lines[1] and "hard=True" in lines[1]
    assert lines[0].startswith("02:13:21.000")


def test_audit_strip_decodes_packed_canvases(tmp_path, capsys):
    store, lats = build_run(f"file://{tmp_path}/run")
    png = tmp_path / "out" / "strip.png"
    args = ["audit", store.url, "--iteration", "0", "--request", "req-7", "--png", str(png)]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"strip: {png}"
    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.float64) / 255
    column = BATCH * (H + 1) - 1  # canvases stacked, 1px apart
    scale = -(-96 // column)
    assert img.shape == (column * scale, (STEPS + 1) * W * scale + STEPS * 2, 3)
    # The last frame's first canvas is the policy's unpacking of the final latent.
    expected = to_pixels(unpack(torch.from_numpy(lats[-1]), H, W).numpy())[0].transpose(1, 2, 0)
    x0 = STEPS * (W * scale + 2)
    got = img[:H * scale:scale, x0:x0 + W * scale:scale]
    np.testing.assert_allclose(got, expected, atol=1 / 255 + 1e-9)


def test_audit_strip_without_canvas_size_is_a_heat_map(tmp_path, capsys):
    store, _ = build_run(f"file://{tmp_path}/run", canvas=False)
    png = tmp_path / "heat.png"
    assert main(["audit", store.url, "--iteration", "0", "--request", "req-7", "--stage",
                 "rollout", "--png", str(png)]) == 0
    img = Image.open(png)
    assert img.height == BATCH * 16  # one grey row per sample, scaled up 16x (the cap)
    assert f"strip: {png}" in capsys.readouterr().out


def test_audit_errors_are_clear(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert main(["audit", str(missing)]) == 3   # a storage error (README: exit codes)
    assert "no Spotlight run" in capsys.readouterr().err
    assert not missing.exists(), "a read-only command must not create the run directory"
    store, _ = build_run(f"file://{tmp_path}/run")
    assert main(["audit", store.url, "--iteration", "0"]) == 2
    assert "--request" in capsys.readouterr().err
    assert main(["audit", store.url, "--iteration", "0", "--request", "nope",
                 "--png", str(tmp_path / "x.png")]) in (2, 3)
    assert "'nope'" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_audit_s3_run_with_endpoint_and_env_credentials(tmp_path, monkeypatch, capsys):
    from moto.server import ThreadedMotoServer

    for key, value in {"AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
                       "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
                       "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1",
                       "AWS_ACCESS_KEY_ID": "AKIAAUDITTEST",
                       "AWS_SECRET_ACCESS_KEY": "audit-secret",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = "http://127.0.0.1:%d" % server.get_host_and_port()[1]
        store, _ = build_run(StorageConfig(url="s3://audit-tests/run", endpoint_url=endpoint,
                                           create_bucket=True))
        png = tmp_path / "s3.png"
        assert main(["audit", "s3://audit-tests/run", "--endpoint-url", endpoint,
                     "--iteration", "0", "--request", "req-7", "--png", str(png)]) == 0
        out = capsys.readouterr().out
        assert "1/1" in out and png.stat().st_size > 0
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # the standard variable works too
        assert main(["audit", "s3://audit-tests/run"]) == 0
        assert "rollout" in capsys.readouterr().out
    finally:
        server.stop()


def test_a_lease_event_names_the_driver_and_whom_it_took_over_from():
    from pipelines.front.audit import format_events

    line = format_events([{"kind": "lease", "at": 0.0, "epoch": 2, "host": "vm-b", "pid": 41,
                           "took_over_from": {"host": "vm-a", "pid": 7, "epoch": 1,
                                              "expired": False}}])
    assert "lease" in line and "epoch=2 host=vm-b pid=41 took_over_from=vm-a:7@1" in line
