"""pipelines.front.audit over a run built through the storage API."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.front.audit import audit_rows, audit_table, latent_heatmap, request_strip
from storage import NotCommittedError, RunStore

SHAPE = (6, 4)


def build_run(url: str) -> RunStore:
    store = RunStore.open(url)
    rng = np.random.default_rng(0)
    lats = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    # Iteration 0: two rollout requests, one preempted after step 1 and resumed.
    with store.latent_sink("iter-0/rollout") as sink:
        for t in range(4):
            sink.commit("a", t, lats[t], num_steps=3, weights_version=0)
        for t in range(2):
            sink.commit("b", t, lats[t], num_steps=3, weights_version=0)
    with store.latent_sink("iter-0/rollout") as sink:
        for t in range(2, 4):
            sink.commit("b", t, lats[t], num_steps=3, weights_version=0)
    with store.latent_sink("iter-0/explore") as sink:
        sink.commit("x", 0, lats[0], num_steps=3, weights_version=0)  # never finished
    store.append_rewards(0, {"prompt": ["p0", "p0", "p1", "p1", "p2"], "seed": [1, 2, 3, 4, 5],
                             "stage": ["rollout"] * 4 + ["explore"],
                             "reward": [1.0, 3.0, 2.0, 2.0, 0.5], "weights_version": 0})
    store.mark_stage_done("iter-0/rollout", {"requests": 2, "preemptions": 1})
    store.save_checkpoint(0, {"w": torch.zeros(2)}, weights_version=1)
    store.append_rewards(1, {"prompt": ["p2"], "seed": [9], "stage": "validation",
                             "reward": [0.25], "weights_version": 1})
    store.mark_stage_done("iter-1/validation")
    return store


def test_audit_table_rows_and_text():
    store = build_run("memory://spotlight-tests/audit-table")
    table = audit_table(store.url)
    assert isinstance(table, str)
    rows = {r["iteration"]: r for r in table.rows}
    assert sorted(rows) == [0, 1]
    r0 = rows[0]
    assert r0["rollout_mean"] == pytest.approx(2.0) and r0["rollout_n"] == 4
    assert r0["rollout_std"] == pytest.approx(np.std([1.0, 3.0, 2.0, 2.0]))
    assert r0["explore_mean"] == pytest.approx(0.5) and r0["validation_mean"] is None
    assert (r0["requests"], r0["requests_complete"], r0["resumes"]) == (3, 2, 1)
    assert r0["preemptions"] == 1 and r0["checkpoint"] == 1 and r0["stages_done"] == ["rollout"]
    r1 = rows[1]
    assert r1["validation_mean"] == pytest.approx(0.25) and r1["requests"] == 0
    assert r1["preemptions"] is None and r1["checkpoint"] is None
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["iter", "explore", "rollout", "validation"]
    assert "2.000±0.707 (4)" in lines[2] and "2/3" in lines[2] and "v1" in lines[2]
    assert audit_rows(store) == table.rows


def test_audit_of_an_empty_run_and_of_no_run():
    store = RunStore.open("memory://spotlight-tests/audit-empty")
    assert "no iterations" in audit_table(store.url)
    with pytest.raises(NotCommittedError, match="no Spotlight run"):
        audit_table("memory://spotlight-tests/audit-nothing-here")


def test_request_strip_default_decode(tmp_path):
    store = build_run("memory://spotlight-tests/audit-strip")
    out = tmp_path / "strips" / "b.png"
    strip = request_strip(store.url, 0, "b", out)
    image = np.asarray(Image.open(out))
    assert image.shape == strip.shape and image.shape[2] == 3
    scale = image.shape[0] // SHAPE[0]
    assert scale * SHAPE[0] == image.shape[0] >= 96
    assert image.shape[1] == 4 * SHAPE[1] * scale + 3 * 2  # 4 steps, 2-pixel gaps
    # Each step is min-max normalised on its own: darkest 0, brightest 255.
    first = image[:, :SHAPE[1] * scale]
    assert first.min() == 0 and first.max() == 255


def test_request_strip_custom_decode_and_stage(tmp_path):
    store = build_run("memory://spotlight-tests/audit-decode")
    seen = []

    def decode(latent):
        seen.append(latent.copy())
        return np.full((10, 5, 3), 0.5)

    strip = request_strip(store, 0, "x", tmp_path / "x.png", decode=decode, stage="explore",
                          min_height=10)
    assert len(seen) == 1 and strip.shape == (10, 5, 3)
    np.testing.assert_array_equal(seen[0], store.read_trajectory("iter-0/explore", "x")[0])
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        request_strip(store, 0, "a", tmp_path / "bad.png", decode=lambda z: np.zeros((4, 4)))
    with pytest.raises(NotCommittedError, match="request 'zz'"):
        request_strip(store, 0, "zz", tmp_path / "zz.png")


def test_latent_heatmap_shapes():
    assert latent_heatmap(np.arange(12.0).reshape(3, 4)).shape == (3, 4, 3)
    assert latent_heatmap(np.arange(5.0)).shape == (1, 5, 3)
    assert latent_heatmap(np.zeros((2, 3, 4))).shape == (2, 12, 3)
    flat = latent_heatmap(np.ones((2, 2)))
    assert np.all(flat == 0.5)
