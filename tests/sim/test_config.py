"""Scenario files: the shipped ones load, bad ones are refused with what to change."""
from __future__ import annotations

import pytest

from spotlight.config import ConfigError, shipped_config
from spotlight.sim.config import SimConfig, load_sim_config
from spotlight.sim.report import prices_for


@pytest.mark.parametrize("name", ["sim/qwen-image-512.yaml", "sim/qwen-image-1280.yaml"])
def test_shipped_scenarios_load_with_their_trace_and_prices(name):
    config = load_sim_config(shipped_config(name))
    assert config.path(config.cluster.trace).is_file()
    prices = prices_for(config)
    assert prices["gpu"] == pytest.approx(55.04 / 8) and prices["spot"] == pytest.approx(14.24 / 8)
    gcp = prices_for(config.with_values({"cluster.cloud": "gcp"}))
    assert gcp == pytest.approx({"gpu": 88.49 / 8, "spot": 39.81 / 8})


def test_unknown_key_names_the_nearest(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("cluster:\n  ondemand_gpu: 8\n")
    with pytest.raises(ConfigError, match="did you mean 'ondemand_gpus'"):
        load_sim_config(path)


def test_a_missing_trace_is_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("cluster:\n  trace: nowhere.csv\n  prices: "
                    f"{shipped_config('prices.yaml')}\n")
    with pytest.raises(ConfigError, match="cluster.trace = 'nowhere.csv' names no file"):
        load_sim_config(path)


@pytest.mark.parametrize("values, message", [
    ({"timing.sp_degree": 3}, "does not divide the 1024 image tokens"),
    ({"timing.sp_degree": 2, "timing.sp_speedup": 2.5}, "at most d times faster"),
    ({"cluster.ondemand_gpus": 2, "timing.sp_degree": 4}, "fewer than one SP group"),
    ({"systems": ["ondemand", "magic"]}, "name systems from"),
    ({"workload.candidates": 16}, "must exceed group_size"),
])
def test_impossible_scenarios_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig().with_values(values)
