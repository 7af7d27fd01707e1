"""rewards.zarr: appended per iteration, readable with nothing but xarray (+ s3fs for S3)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

from storage import CorruptObjectError, RunStore


def iteration_rows(iteration: int, prompts: list[str], samples: int, stage: str,
                   offset: float = 0.0) -> dict[str, list]:
    rows: dict[str, list] = {"prompt": [], "seed": [], "stage": [], "reward": [],
                             "weights_version": [], "ocr_distance": []}
    for p_i, prompt in enumerate(prompts):
        for s in range(samples):
            rows["prompt"].append(prompt)
            rows["seed"].append(1000 * iteration + 10 * p_i + s)
            rows["stage"].append(stage)
            rows["reward"].append(offset + 0.1 * s + p_i)
            rows["weights_version"].append(iteration)
            rows["ocr_distance"].append(float(s))
    return rows


def merge(*tables: dict[str, list]) -> dict[str, list]:
    return {k: sum((t[k] for t in tables), []) for k in tables[0]}


def plain_open(store_config, store: RunStore, moto_endpoint_options=None):
    """Open rewards.zarr the way a user with only xarray (and s3fs) would."""
    url = store.url + "/rewards.zarr"
    if store.url.startswith("s3://"):
        return xr.open_zarr(url, storage_options=moto_endpoint_options)
    return xr.open_zarr(url)


def test_append_two_iterations_and_open_with_plain_xarray(store_config, request):
    store = RunStore.open(store_config)
    it0 = merge(iteration_rows(0, ["p0", "p1"], 3, "rollout"),
                iteration_rows(0, ["p2", "p3"], 2, "explore", offset=5.0))
    store.append_rewards(0, it0)
    # Iteration 1 brings a new prompt and more samples per prompt: the axes grow.
    it1 = merge(iteration_rows(1, ["p2", "p3"], 3, "rollout"),
                iteration_rows(1, ["p9"], 4, "explore", offset=7.0),
                iteration_rows(1, ["p0"], 1, "validation", offset=9.0))
    store.append_rewards(1, it1)

    options = (request.getfixturevalue("moto_s3").storage_options()
               if store.url.startswith("s3://") else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # e.g. "failed to open consolidated"
        ds = plain_open(store_config, store, options)
    assert dict(ds.sizes) == {"iteration": 2, "prompt": 5, "sample": 4}
    assert list(ds["iteration"].values) == [0, 1]
    assert [str(p) for p in ds["prompt"].values] == ["p0", "p1", "p2", "p3", "p9"]
    assert set(ds.coords) >= {"seed", "stage", "weights_version"}
    assert "ocr_distance" in ds.data_vars

    it0_p1 = ds.sel(iteration=0, prompt="p1")
    np.testing.assert_allclose(it0_p1["reward"].values[:3], [1.0, 1.1, 1.2])
    assert np.isnan(it0_p1["reward"].values[3])  # the sample axis grew after iteration 0
    assert list(it0_p1["seed"].values) == [10, 11, 12, -1]
    assert [str(s) for s in it0_p1["stage"].values] == ["rollout"] * 3 + [""]
    assert int(ds.sel(iteration=0, prompt="p9")["seed"].max()) == -1  # prompt added later

    it1 = ds.sel(iteration=1)
    explore = it1["reward"].where(it1["stage"] == "explore")
    np.testing.assert_allclose(float(explore.mean()), 7.0 + np.mean([0.0, 0.1, 0.2, 0.3]))
    assert int((it1["stage"] == "validation").sum()) == 1
    assert set(np.unique(it1["weights_version"].values)) == {-1, 1}


def test_reappending_an_iteration_overwrites_it(store_config):
    store = RunStore.open(store_config)
    store.append_rewards(0, iteration_rows(0, ["a"], 2, "rollout"))
    store.append_rewards(1, iteration_rows(1, ["a"], 2, "rollout"))
    store.append_rewards(1, iteration_rows(1, ["a"], 2, "rollout", offset=100.0))  # resumed run
    ds = store.rewards.load()
    assert list(ds["iteration"].values) == [0, 1]
    np.testing.assert_allclose(ds["reward"].sel(iteration=1, prompt="a").values, [100.0, 100.1])
    with pytest.raises(ValueError, match="in order"):
        store.rewards.append(3, iteration_rows(3, ["a"], 2, "rollout"))
        store.rewards.append(2, iteration_rows(2, ["a"], 2, "rollout"))


def test_bad_reward_tables_are_refused():
    store = RunStore.open("memory://spotlight-tests/bad-rewards")
    good = iteration_rows(0, ["a"], 2, "rollout")
    with pytest.raises(ValueError, match="lack columns.*seed"):
        store.append_rewards(0, {k: v for k, v in good.items() if k != "seed"})
    with pytest.raises(ValueError, match="shape"):
        store.append_rewards(0, {**good, "seed": [1]})
    store.append_rewards(0, good)
    with pytest.raises(ValueError, match="extra columns are fixed"):
        store.append_rewards(1, {**iteration_rows(1, ["a"], 2, "rollout"), "new_metric": [1, 2]})


def test_scalar_stage_and_weights_version():
    store = RunStore.open("memory://spotlight-tests/scalar-cols")
    store.append_rewards(4, {"prompt": ["x", "y"], "seed": [1, 2], "reward": [0.5, 0.25],
                             "stage": "validation", "weights_version": 4})
    ds = store.rewards.load()
    assert [str(s) for s in ds["stage"].values.ravel()] == ["validation", "validation"]
    assert list(ds["weights_version"].values.ravel()) == [4, 4]


def test_corrupted_reward_chunk_is_an_error(store_config):
    store = RunStore.open(store_config)
    store.append_rewards(0, iteration_rows(0, ["a", "b"], 3, "rollout"))
    parts = ("rewards.zarr", "reward", "c", "0", "0", "0")
    data = bytearray(store.location.read_bytes(*parts))
    data[len(data) // 2] ^= 0xFF
    store.location.write_bytes(bytes(data), *parts)
    with pytest.raises(CorruptObjectError, match="rewards.zarr"):
        store.rewards.load()
