"""``spotlight check-gpu`` at tiny size on the CPU: every part runs in its own process and the
record holds every key the GPU run will fill; a part cut off by its time limit is recorded as
such; the wheel bundle names what the GPU image lacks (nothing is downloaded here)."""
from __future__ import annotations

import json

import pytest

from pipelines.gpu import bundle
from pipelines.gpu.record import PARTS, Record, expected_keys, missing_keys
from pipelines.gpu.steps import predictions, scale_config
from spotlight import main
from spotlight.config import PROJECT_ROOT
from spotlight.models.base import model_size

pytestmark = pytest.mark.timeout(900)


@pytest.mark.slow
def test_check_gpu_at_tiny_size_completes_and_writes_every_key(tmp_path, capsys):
    path = tmp_path / "check.json"
    code = main(["check-gpu", "--device", "cpu", "--json", str(path),
                 "--timeout-per-part", "600", "--work-dir", str(tmp_path)])
    data = json.loads(path.read_text())
    assert code == 0, (capsys.readouterr(), data.get("parts"))
    assert missing_keys(data, "tiny") == [] and data["check"]["missing_keys"] == []
    assert {p: data["parts"][p]["status"] for p in PARTS} == dict.fromkeys(PARTS, "done")
    assert data["check"]["size"] == "tiny" and data["environment"]["device"] == "cpu"
    # The sizing model counts the transformer and the adapter the check built.
    model = data["steps"]["model"]
    assert model["transformer_params"] == model["predicted_transformer_params"] > 0
    assert model["trainable_params"] == model["predicted_trainable_params"] > 0
    for scale in ("32", "64"):
        for kind in ("rollout", "train"):
            step = data["steps"][scale][kind]
            assert step["seconds"] > 0 and step["predicted_seconds"] > 0
            assert step["seconds_ratio"] == pytest.approx(step["seconds"] /
                                                          step["predicted_seconds"])
            assert step["memory_ratio"] == pytest.approx(step["peak_gib"] /
                                                         step["predicted_gib"])
    assert data["steps"]["64"]["rollout"]["image_tokens"] == \
        4 * data["steps"]["32"]["rollout"]["image_tokens"]
    # SD3.5's transformer beside its own predictions (the published size on a GPU).
    sd35 = data["steps_sd35"]
    assert sd35["model"]["transformer_params"] == sd35["model"]["predicted_transformer_params"]
    assert sd35["model"]["trainable_params"] == sd35["model"]["predicted_trainable_params"] > 0
    for scale in ("32", "64"):
        for kind in ("rollout", "train"):
            step = sd35[scale][kind]
            assert step["seconds"] > 0 and step["predicted_seconds"] > 0, step
            assert step["passes"] == 2   # true CFG, as the SD3.5 recipes
    pipeline = data["pipeline"]
    assert pipeline["iterations"]["completed"] == 2
    assert {w: placed["policy_devices"] for w, placed in
            pipeline["iterations"]["workers_device"].items()} == {"gpu-0": ["cpu"],
                                                                   "spot-0": ["cpu"]}
    resumed = pipeline["preempt_resume"]
    assert resumed["preempted"] and resumed["resumed_from"] > 0
    assert resumed["equal"] and resumed["max_abs_diff"] == 0.0
    # The CPU computes a request again, and resumed, bit for bit, whatever the algorithms.
    for mode in ("default", "deterministic"):
        assert data["determinism"][mode]["rerun"]["equal"]
        assert data["determinism"][mode]["resume"]["equal"]
    # The training group's communicator on the device (gloo on the CPU), and a sharded step.
    group = data["collectives"]["group"]
    assert group["backend"] == "gloo" and group["world"] == 1 and group["all_reduce_ok"]
    assert data["collectives"]["sharded_fp32"]["max_abs_diff"] <= 1e-5
    assert 0 < data["collectives"]["sharded_bf16"]["max_abs_diff"] < 1.0   # bf16 compute
    for part in PARTS:
        assert (tmp_path / f"check.{part}.log").is_file()


def test_a_part_past_its_time_limit_is_killed_and_recorded_and_the_others_still_run(tmp_path):
    path = tmp_path / "cut.json"
    # A tenth of a second: the part's process is killed while it still imports.
    code = main(["check-gpu", "--device", "cpu", "--json", str(path), "--sections",
                 "steps,determinism", "--timeout-per-part", "0.1"])
    data = json.loads(path.read_text())
    assert code == 1
    assert [data["parts"][p]["status"] for p in ("steps", "determinism")] == ["timeout"] * 2
    assert data["check"]["finished_at"] and "pipeline" not in data["parts"]


def test_unknown_sections_are_named(tmp_path, capsys):
    assert main(["check-gpu", "--device", "cpu", "--json", str(tmp_path / "x.json"),
                 "--sections", "steps,gpus"]) == 2
    assert "--sections 'steps,gpus': unknown ['gpus']" in capsys.readouterr().err


def test_the_record_is_rewritten_whole_after_every_figure(tmp_path):
    record = Record(tmp_path / "r.json")
    record.update("steps.512.rollout", {"seconds": 1.5, "peak_gib": float("nan")})
    assert json.loads(record.path.read_text()) == \
        {"steps": {"512": {"rollout": {"seconds": 1.5, "peak_gib": None}}}}
    record.merge("steps.512.rollout", {"oom": True})
    assert record.read()["steps"]["512"]["rollout"] == {"seconds": 1.5, "peak_gib": None,
                                                         "oom": True}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]   # no temporary left behind
    assert "steps.1280.train.memory_ratio" in expected_keys("real")
    assert "steps.1280.train.memory_ratio" in missing_keys(record.read(), "real")


def test_extra_shapes_are_measured_with_their_side_and_batch_and_bad_ones_are_named(tmp_path,
                                                                                 capsys):
    path = tmp_path / "shapes.json"
    assert main(["check-gpu", "--device", "cpu", "--json", str(path), "--sections", "steps",
                 "--shapes", "48x2", "--timeout-per-part", "600"]) == 0
    data = json.loads(path.read_text())
    assert data["check"]["shapes"] == ["48x2"]
    for kind in ("rollout", "train"):
        step = data["steps"]["48x2"][kind]
        assert step["batch"] == 2 and step["seconds"] > 0 and step["predicted_seconds"] > 0
    # Image tokens grow with the area: 48² has (48/32)² = 9/4 times 32²'s.
    assert data["steps"]["48x2"]["rollout"]["image_tokens"] * 4 == \
        data["steps"]["32"]["rollout"]["image_tokens"] * 9
    capsys.readouterr()
    assert main(["check-gpu", "--device", "cpu", "--json", str(tmp_path / "bad.json"),
                 "--shapes", "1024x4,50x2"]) == 2
    assert "'50x2' is not SIDExBATCH" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("name", ["steps-fit.json", "steps-validation.json"])
def test_the_sizing_model_predicts_the_h200_check_within_a_quarter(name):
    """The stored H200 figures (docs/data) against the sizing model as it is now: the fit's
    own points and the shapes it was not fitted on (1024x4, 1536x2, 768x8)."""
    data = json.loads((PROJECT_ROOT / "docs" / "data" / "check-gpu-h200-2026-11-28" / name)
                      .read_text())
    checked = 0
    for scale, kinds in data["steps"].items():
        if scale == "model":
            continue
        config = scale_config("real", scale, "cpu")
        predicted = predictions(config, model_size(config))
        for kind, step in kinds.items():
            seconds, gib = predicted[kind]
            assert step["seconds"] / seconds == pytest.approx(1.0, abs=0.25), (scale, kind)
            assert step["peak_gib"] / gib == pytest.approx(1.0, abs=0.25), (scale, kind)
            checked += 1
    assert checked == (4 if name == "steps-fit.json" else 10)


def test_the_bundle_brings_what_the_gpu_image_lacks_and_nothing_it_has():
    pins = bundle.closure()
    assert {"diffusers", "dask", "distributed", "zarr", "numcodecs", "tornado",
            "google-crc32c"} <= set(pins)
    assert not {"torch", "transformers", "peft", "numpy", "fsspec", "xarray"} & set(pins)
    # importlib_metadata is a requirement of dask only below Python 3.12; diffusers needs it.
    assert "importlib-metadata" in pins
    line = bundle.device_command(".whl")
    assert "\n" not in line and "--no-deps" in line and "pipelines.front.check_gpu" in line
