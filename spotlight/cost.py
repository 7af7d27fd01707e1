"""Dollar cost of a run: a cloud price table and a ledger of how long each worker was alive.

Pure bookkeeping, no Dask: the driver reports which workers are alive, the ledger keeps their
alive intervals, and the cost of a time window is each interval's overlap with the window times
the hourly price of the worker's class. A worker holds one GPU, so a worker-second is a GPU-second.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The config package checks price files with this module: import its lower modules, not it.
from spotlight.config.base import ConfigError
from spotlight.config.sections import MARKETS, CostConfig

__all__ = ["CostConfig", "CostLedger", "load_prices", "price_per_gpu_hour", "worker_class_prices"]
WORKER_CLASSES = ("gpu", "spot")   # the Dask resource names of on-demand and spot workers


def _nearest(key: str, options: Iterable[str]) -> str:
    near = difflib.get_close_matches(str(key), list(options), n=1, cutoff=0.0)
    return f"; did you mean '{near[0]}'?" if near else ""


@dataclass(frozen=True)
class InstancePrice:
    """One instance type: its GPU count and its USD price per instance-hour on each market."""

    gpus: int
    on_demand: float | None = None
    spot: float | None = None

    def priced_markets(self) -> list[str]:
        return [m for m in MARKETS if getattr(self, m) is not None]


@dataclass(frozen=True)
class PriceTable:
    """Instance prices by provider and instance name, remembering the file they came from."""

    source: str
    providers: dict[str, dict[str, InstancePrice]]

    def instance(self, provider: str, name: str) -> InstancePrice:
        """The prices of ``provider``'s ``name``; an unknown key is an error naming the file."""
        instances = self.providers.get(provider)
        if instances is None:
            raise ConfigError(f"{self.source}: unknown provider '{provider}'"
                              f"{_nearest(provider, self.providers)} (providers in this table: "
                              f"{', '.join(self.providers)}); pick one or add it to the file")
        if name not in instances:
            raise ConfigError(f"{self.source}: unknown instance '{provider}/{name}'"
                              f"{_nearest(name, instances)} ({provider} instances in this table: "
                              f"{', '.join(instances)}); pick one or add it to the file")
        return instances[name]


def _parse_instance(source: str, where: str, data: Any) -> InstancePrice:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{where}' must be a mapping with keys gpus, on_demand, spot; "
                          f"got {data!r}")
    keys = ("gpus", *MARKETS)
    for key in data:
        if key not in keys:
            raise ConfigError(f"{source}: unknown key '{where}/{key}'{_nearest(key, keys)} "
                              f"(valid keys here: {', '.join(keys)})")
    gpus = data.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"{source}: '{where}/gpus' = {gpus!r} must be a whole number >= 1 "
                          "(the GPU count of one instance)")
    prices = {}
    for market in MARKETS:
        price = data.get(market)
        if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                                  or not math.isfinite(price) or price < 0):
            raise ConfigError(f"{source}: '{where}/{market}' = {price!r} must be a price in USD "
                              "per instance-hour >= 0, or null where the market has no price")
        prices[market] = None if price is None else float(price)
    if all(p is None for p in prices.values()):
        raise ConfigError(f"{source}: '{where}' has no price; give at least one of "
                          f"{', '.join(MARKETS)}")
    return InstancePrice(gpus=gpus, **prices)


def load_prices(path: str | Path = "configs/prices.yaml") -> PriceTable:
    """Load and validate a price table: provider -> instance -> {gpus, on_demand, spot}."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(f"price table '{source}' does not exist; pass an existing YAML file "
                          "such as configs/prices.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{source}: must map providers to instances, e.g. "
                          "'aws: {p5.48xlarge: {gpus: 8, on_demand: 55.04}}'")
    providers: dict[str, dict[str, InstancePrice]] = {}
    for provider, instances in data.items():
        if not isinstance(instances, dict) or not instances:
            raise ConfigError(f"{source}: provider '{provider}' must map instance names to "
                              f"{{gpus, on_demand, spot}}; got {instances!r}")
        providers[str(provider)] = {
            str(name): _parse_instance(source, f"{provider}/{name}", entry)
            for name, entry in instances.items()}
    return PriceTable(source=source, providers=providers)


def price_per_gpu_hour(table: PriceTable, provider: str, instance: str, market: str) -> float:
    """USD per GPU-hour: the instance's hourly price on ``market`` divided by its GPU count."""
    if market not in MARKETS:
        raise ConfigError(f"unknown market '{market}'{_nearest(market, MARKETS)}; "
                          f"choose one of {list(MARKETS)}")
    entry = table.instance(provider, instance)
    price = getattr(entry, market)
    if price is None:
        raise ConfigError(f"{table.source}: '{provider}/{instance}' has no '{market}' price; "
                          f"markets with a price: {', '.join(entry.priced_markets())}. Choose one "
                          "of them, another instance, or add the price to the file")
    return price / entry.gpus


def worker_class_instances(config: CostConfig) -> dict[str, tuple[str, str]]:
    """The instance type and market each worker class runs on, e.g. {"gpu": ("p5.48xlarge",
    "on_demand"), ...}."""
    return {"gpu": (config.gpu_instance, config.gpu_market),
            "spot": (config.spot_instance, config.spot_market)}


def worker_class_prices(config: CostConfig, table: PriceTable) -> dict[str, float]:
    """USD per GPU-hour of each worker class, e.g. {"gpu": 6.88, "spot": 1.78}."""
    prices = {}
    for cls, (instance, market) in worker_class_instances(config).items():
        try:
            prices[cls] = price_per_gpu_hour(table, config.provider, instance, market)
        except ConfigError as err:
            raise ConfigError(f"{err} (set by cost.provider, cost.{cls}_instance, "
                              f"cost.{cls}_market)") from None
    return prices


def run_prices(config: CostConfig) -> dict[str, float]:
    """USD per GPU-hour of each worker class of a run: its ``cost`` section priced from the
    table ``cost.prices`` names."""
    return worker_class_prices(config, load_prices(config.prices))


def interval_overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    """Length of the overlap of [a0, a1] and [b0, b1]; 0.0 when they are disjoint."""
    return max(0.0, min(a1, b1) - max(a0, b0))


def _check_time(what: str, t: float) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"{what} = {t!r} must be a finite time in seconds")
    return float(t)


class CostLedger:
    """Alive intervals of workers, and the dollars and GPU-seconds they cost over a time window.

    Fed by polling: ``worker_joined`` for every worker seen alive (repeats are ignored while it
    stays alive), ``worker_left`` once it is gone. A worker that comes back under the same name
    opens a new interval. Prices (USD per GPU-hour by worker class) are given at construction or
    per call.
    """

    def __init__(self, prices: Mapping[str, float] | None = None) -> None:
        self.prices = None if prices is None else dict(prices)
        self.intervals: list[dict] = []   # {"worker", "worker_class", "start", "end" (None: alive)}
        self._alive: dict[str, dict] = {}
        self._last_end: dict[str, float] = {}   # when each worker last left (no time travel)

    def worker_joined(self, name: str, worker_class: str, t: float) -> None:
        t = _check_time(f"worker_joined({name!r}) t", t)
        if worker_class not in WORKER_CLASSES:
            raise ValueError(f"worker '{name}' has class '{worker_class}'; expected one of "
                             f"{list(WORKER_CLASSES)}")
        alive = self._alive.get(name)
        if alive is not None:
            if alive["worker_class"] != worker_class:
                raise ValueError(f"worker '{name}' is alive as '{alive['worker_class']}' and "
                                 f"cannot join again as '{worker_class}'")
            return
        ended = self._last_end.get(name)
        if ended is not None and t < ended:
            raise ValueError(f"worker '{name}' rejoins at t={t} before it last left "
                             f"(t={ended}); times must not go backwards")
        interval = {"worker": name, "worker_class": worker_class, "start": t, "end": None}
        self.intervals.append(interval)
        self._alive[name] = interval

    def worker_left(self, name: str, t: float) -> None:
        t = _check_time(f"worker_left({name!r}) t", t)
        interval = self._alive.get(name)
        if interval is None:
            raise ValueError(f"worker '{name}' left but is not alive in the ledger (alive: "
                             f"{', '.join(self._alive) or 'none'})")
        if t < interval["start"]:
            raise ValueError(f"worker '{name}' left at t={t}, before it joined at "
                             f"t={interval['start']}")
        interval["end"] = t
        self._last_end[name] = t
        del self._alive[name]

    def alive_workers(self) -> list[str]:
        return list(self._alive)

    def gpu_seconds(self, start: float, end: float) -> dict[str, float]:
        """GPU-seconds per worker class within [start, end]; a live worker counts up to ``end``."""
        start, end = _check_time("start", start), _check_time("end", end)
        if end < start:
            raise ValueError(f"window end {end} is before its start {start}")
        seconds = dict.fromkeys(WORKER_CLASSES, 0.0)
        for iv in self.intervals:
            stop = end if iv["end"] is None else iv["end"]
            seconds[iv["worker_class"]] += interval_overlap(iv["start"], stop, start, end)
        return seconds

    def cost(self, start: float, end: float,
             prices: Mapping[str, float] | None = None) -> dict[str, float]:
        """USD per worker class and "total" for the workers alive within [start, end]."""
        prices = self.prices if prices is None else prices
        if prices is None:
            raise ValueError("CostLedger has no prices; pass prices= (USD per GPU-hour by worker "
                             "class, from worker_class_prices) to the ledger or to this call")
        dollars = {}
        for cls, seconds in self.gpu_seconds(start, end).items():
            if seconds and cls not in prices:
                raise ValueError(f"no price for worker class '{cls}'; prices given for: "
                                 f"{', '.join(prices) or 'none'}")
            dollars[cls] = seconds * prices[cls] / 3600.0 if seconds else 0.0
        dollars["total"] = sum(dollars.values())
        return dollars

    def total(self, now: float, prices: Mapping[str, float] | None = None) -> dict[str, float]:
        """USD per worker class and "total" from the first join up to ``now``."""
        first = min((iv["start"] for iv in self.intervals), default=now)
        return self.cost(min(first, now), now, prices)

    def to_dict(self) -> dict:
        return {"intervals": [dict(iv) for iv in self.intervals]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  prices: Mapping[str, float] | None = None) -> CostLedger:
        """Rebuild a ledger saved with ``to_dict`` (checked as if replayed)."""
        ledger = cls(prices)
        for i, iv in enumerate(data.get("intervals", [])):
            missing = {"worker", "worker_class", "start", "end"} - set(iv)
            if missing:
                raise ValueError(f"ledger interval {i} lacks {sorted(missing)}: {iv!r}")
            if iv["worker"] in ledger._alive:
                raise ValueError(f"ledger interval {i}: worker '{iv['worker']}' is already alive "
                                 "in an earlier open interval")
            ledger.worker_joined(iv["worker"], iv["worker_class"], iv["start"])
            if iv["end"] is not None:
                ledger.worker_left(iv["worker"], iv["end"])
        return ledger
