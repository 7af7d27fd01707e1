import json

import pytest

from spotlight.config import ConfigError
from spotlight.cost import (
    CostConfig,
    CostLedger,
    interval_overlap,
    load_prices,
    price_per_gpu_hour,
    worker_class_prices,
)

AWS_GPU = 55.04 / 8     # on-demand p5.48xlarge, USD per GPU-hour
AWS_SPOT = 14.24 / 8    # spot p5.48xlarge
PRICES = {"gpu": AWS_GPU, "spot": AWS_SPOT}
HOUR = 3600.0


def write(tmp_path, text):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    return path


def test_shipped_table_has_the_paper_figures():
    table = load_prices()
    assert table.source == "configs/prices.yaml"
    assert price_per_gpu_hour(table, "aws", "p5.48xlarge", "on_demand") == pytest.approx(6.88)
    assert price_per_gpu_hour(table, "aws", "p5.48xlarge", "spot") == pytest.approx(1.78)
    assert price_per_gpu_hour(table, "aws", "p5.4xlarge", "spot") == pytest.approx(2.47)
    assert price_per_gpu_hour(table, "gcp", "a3-highgpu-8g", "spot") == pytest.approx(39.81 / 8)
    assert price_per_gpu_hour(table, "azure", "ND96isr_H100_v5", "on_demand") == \
        pytest.approx(98.32 / 8)
    assert table.instance("aws", "p5.4xlarge").on_demand is None


def test_worker_class_prices_follow_the_config():
    table = load_prices()
    assert worker_class_prices(CostConfig(), table) == pytest.approx(PRICES)
    config = CostConfig(provider="gcp", gpu_instance="a3-highgpu-8g",
                        spot_instance="a3-highgpu-8g")
    assert worker_class_prices(config, table) == pytest.approx(
        {"gpu": 88.49 / 8, "spot": 39.81 / 8})


def test_missing_market_lists_the_priced_ones():
    table = load_prices()
    with pytest.raises(ValueError, match=r"configs/prices.yaml.*'aws/p5.4xlarge' has no "
                                         r"'on_demand' price; markets with a price: spot"):
        price_per_gpu_hour(table, "aws", "p5.4xlarge", "on_demand")
    config = CostConfig(gpu_instance="p5.4xlarge")
    with pytest.raises(ValueError, match=r"cost.gpu_instance"):
        worker_class_prices(config, table)


def test_unknown_provider_and_instance_name_file_key_and_nearest():
    table = load_prices()
    with pytest.raises(ValueError, match=r"configs/prices.yaml: unknown provider 'awz'; did you "
                                         r"mean 'aws'\?.*aws, gcp, azure"):
        price_per_gpu_hour(table, "awz", "p5.48xlarge", "spot")
    with pytest.raises(ValueError, match=r"configs/prices.yaml: unknown instance "
                                         r"'aws/p5.48xl'; did you mean 'p5.48xlarge'\?"):
        price_per_gpu_hour(table, "aws", "p5.48xl", "spot")
    with pytest.raises(ValueError, match=r"unknown market 'reserved'.*'on_demand', 'spot'"):
        price_per_gpu_hour(table, "aws", "p5.48xlarge", "reserved")


@pytest.mark.parametrize("body, message", [
    ("aws:\n  p5.48xlarge: {gpus: 8, spot: -1.0}\n",
     r"'aws/p5.48xlarge/spot' = -1.0 must be a price"),
    ("aws:\n  p5.48xlarge: {gpus: 8, spot: cheap}\n", r"'aws/p5.48xlarge/spot' = 'cheap'"),
    ("aws:\n  p5.48xlarge: {gpus: 0, spot: 1.0}\n", r"'aws/p5.48xlarge/gpus' = 0 must be"),
    ("aws:\n  p5.48xlarge: {spot: 1.0}\n", r"'aws/p5.48xlarge/gpus' = None"),
    ("aws:\n  p5.48xlarge: {gpus: 8, ondemand: 1.0}\n",
     r"unknown key 'aws/p5.48xlarge/ondemand'; did you mean 'on_demand'\?"),
    ("aws:\n  p5.48xlarge: {gpus: 8}\n", r"'aws/p5.48xlarge' has no price"),
    ("aws: 3\n", r"provider 'aws' must map instance names"),
    ("- aws\n", r"must map providers to instances"),
    ("aws: [unclosed\n", r"not valid YAML"),
])
def test_bad_price_table_names_file_and_key(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ValueError, match=message) as err:   # ConfigError is a ValueError
        load_prices(path)
    assert str(err.value).startswith(f"{path}: ")


def test_missing_price_file():
    with pytest.raises(ValueError, match="price table 'nowhere.yaml' does not exist"):
        load_prices("nowhere.yaml")


def test_cost_config_refuses_unknown_market():
    with pytest.raises(ConfigError, match=r"CostConfig.gpu_market = 'reserved'"):
        CostConfig(gpu_market="reserved")


def test_interval_overlap():
    assert interval_overlap(0, 10, 5, 20) == 5
    assert interval_overlap(5, 20, 0, 10) == 5
    assert interval_overlap(0, 10, 2, 3) == 1
    assert interval_overlap(0, 10, 10, 20) == 0
    assert interval_overlap(0, 10, 11, 20) == 0
    assert interval_overlap(0, 10, -5, 100) == 10


def test_one_gpu_worker_for_one_hour():
    ledger = CostLedger(PRICES)
    ledger.worker_joined("gpu-0", "gpu", 1000.0)
    ledger.worker_left("gpu-0", 1000.0 + HOUR)
    cost = ledger.cost(0.0, 10 * HOUR)
    assert cost["gpu"] == pytest.approx(55.04 / 8, rel=1e-12)
    assert cost["spot"] == 0.0 and cost["total"] == pytest.approx(6.88, rel=1e-12)
    assert ledger.gpu_seconds(0.0, 10 * HOUR) == {"gpu": HOUR, "spot": 0.0}


def test_partial_overlaps_and_a_worker_that_left():
    ledger = CostLedger()
    ledger.worker_joined("gpu-0", "gpu", 0.0)
    ledger.worker_joined("spot-0", "spot", 600.0)
    ledger.worker_joined("spot-1", "spot", 0.0)
    ledger.worker_left("spot-1", 1200.0)     # preempted
    # window [900, 2700]: gpu-0 alive throughout (1800 s), spot-0 alive throughout (1800 s),
    # spot-1 only [900, 1200] (300 s)
    assert ledger.gpu_seconds(900.0, 2700.0) == {"gpu": 1800.0, "spot": 2100.0}
    cost = ledger.cost(900.0, 2700.0, PRICES)
    assert cost["gpu"] == pytest.approx(0.5 * AWS_GPU, rel=1e-12)
    assert cost["spot"] == pytest.approx(2100.0 / HOUR * AWS_SPOT, rel=1e-12)
    assert cost["total"] == pytest.approx(cost["gpu"] + cost["spot"], rel=1e-12)
    # a window after spot-1 left sees none of it
    assert ledger.gpu_seconds(1200.0, 1800.0) == {"gpu": 600.0, "spot": 600.0}
    # a window before a worker joined sees none of it
    assert ledger.gpu_seconds(0.0, 600.0) == {"gpu": 600.0, "spot": 600.0}


def test_live_workers_count_up_to_the_window_end_and_total():
    ledger = CostLedger(PRICES)
    ledger.worker_joined("gpu-0", "gpu", 100.0)
    ledger.worker_joined("spot-0", "spot", 100.0 + HOUR / 2)
    assert ledger.total(100.0 + HOUR) == pytest.approx(
        {"gpu": AWS_GPU, "spot": AWS_SPOT / 2, "total": AWS_GPU + AWS_SPOT / 2}, rel=1e-12)
    assert ledger.total(100.0)["total"] == 0.0
    assert CostLedger(PRICES).total(5.0) == {"gpu": 0.0, "spot": 0.0, "total": 0.0}


def test_polling_rejoin_is_ignored_and_a_return_opens_a_new_interval():
    ledger = CostLedger()
    for t in (0.0, 10.0, 20.0):                  # the driver reports every alive worker per poll
        ledger.worker_joined("spot-0", "spot", t)
    assert ledger.alive_workers() == ["spot-0"]
    ledger.worker_left("spot-0", 30.0)
    assert ledger.alive_workers() == []
    ledger.worker_joined("spot-0", "spot", 100.0)
    ledger.worker_left("spot-0", 110.0)
    assert ledger.gpu_seconds(0.0, 200.0)["spot"] == 40.0
    assert len(ledger.intervals) == 2


def test_ledger_refuses_inconsistent_events():
    ledger = CostLedger()
    ledger.worker_joined("w", "gpu", 10.0)
    with pytest.raises(ValueError, match="alive as 'gpu' and cannot join again as 'spot'"):
        ledger.worker_joined("w", "spot", 11.0)
    with pytest.raises(ValueError, match="left at t=5.0, before it joined at t=10.0"):
        ledger.worker_left("w", 5.0)
    with pytest.raises(ValueError, match="'ghost' left but is not alive"):
        ledger.worker_left("ghost", 12.0)
    with pytest.raises(ValueError, match="class 'tpu'"):
        ledger.worker_joined("x", "tpu", 12.0)
    ledger.worker_left("w", 20.0)
    with pytest.raises(ValueError, match="rejoins at t=15.0 before it last left"):
        ledger.worker_joined("w", "gpu", 15.0)
    with pytest.raises(ValueError, match="window end 1.0 is before its start 2.0"):
        ledger.gpu_seconds(2.0, 1.0)
    with pytest.raises(ValueError, match="has no prices"):
        ledger.cost(0.0, 30.0)
    with pytest.raises(ValueError, match="no price for worker class 'gpu'"):
        ledger.cost(0.0, 30.0, {"spot": 1.0})


def test_json_round_trip_keeps_costs_and_live_workers():
    ledger = CostLedger(PRICES)
    ledger.worker_joined("gpu-0", "gpu", 0.0)
    ledger.worker_joined("spot-0", "spot", 0.0)
    ledger.worker_left("spot-0", 1800.0)
    ledger.worker_joined("spot-0", "spot", 2000.0)
    restored = CostLedger.from_dict(json.loads(json.dumps(ledger.to_dict())), PRICES)
    assert restored.to_dict() == ledger.to_dict()
    assert restored.alive_workers() == ["gpu-0", "spot-0"]
    assert restored.cost(0.0, HOUR) == ledger.cost(0.0, HOUR)
    restored.worker_left("gpu-0", HOUR)          # a restored live worker can still leave
    assert restored.gpu_seconds(0.0, 2 * HOUR)["gpu"] == HOUR


def test_from_dict_refuses_two_open_intervals_of_one_worker():
    open_twice = {"intervals": [
        {"worker": "w", "worker_class": "gpu", "start": 0.0, "end": None},
        {"worker": "w", "worker_class": "gpu", "start": 5.0, "end": None}]}
    with pytest.raises(ValueError, match="interval 1: worker 'w' is already alive"):
        CostLedger.from_dict(open_twice)
    with pytest.raises(ValueError, match=r"interval 0 lacks \['end'\]"):
        CostLedger.from_dict({"intervals": [{"worker": "w", "worker_class": "gpu", "start": 0.0}]})
