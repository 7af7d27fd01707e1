"""rewards.zarr: every scored sample of the run as one xarray Dataset.

Dims ``(iteration, prompt, sample)``: ``prompt`` is labelled by prompt id, ``sample`` is the
sample's slot within (iteration, prompt). Variables: ``reward`` (float64) plus any extra numeric
columns; coordinates ``seed``, ``stage`` (explore / rollout / validation) and
``weights_version`` over all three dims. Cells no sample filled have ``reward`` NaN,
``seed`` -1, ``weights_version`` -1 and ``stage`` "".

One ``append`` per iteration along ``iteration``; re-appending an iteration rewrites it in place
(idempotent on resume). New prompts or more samples grow the prompt/sample axes. Metadata is
consolidated, so a user with only xarray (and s3fs for S3) can run::

    xarray.open_zarr(RUN_URL + "/rewards.zarr")                      # file:// or memory://
    xarray.open_zarr(RUN_URL + "/rewards.zarr", storage_options={"endpoint_url": ...})  # S3
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import CorruptObjectError
from .urls import RunLocation

REWARDS = "rewards.zarr"
DIMS = ("iteration", "prompt", "sample")
REQUIRED = ("prompt", "seed", "stage", "reward", "weights_version")
MISSING_INT = -1


_CONSOLIDATED_NOTICE = ".*[Cc]onsolidated metadata.*"  # zarr: "not yet in the v3 spec"


class RewardTable:
    """Append and read the run's reward Dataset."""

    def __init__(self, location: RunLocation) -> None:
        self.location = location
        self.url = location.child_url(REWARDS)

    def _store(self, read_only: bool = False) -> Any:
        return self.location.zarr_store(REWARDS, read_only=read_only)

    def exists(self) -> bool:
        return self.location.exists(REWARDS, "zarr.json")

    def open(self) -> Any:
        """The Dataset (lazily loaded), or None if no iteration was appended yet."""
        import xarray as xr

        if not self.exists():
            return None
        try:
            return self.location.retry(
                lambda: xr.open_zarr(self._store(read_only=True), chunks=None), "open", REWARDS)
        except (KeyError, ValueError) as exc:
            raise CorruptObjectError(self.url, f"not a readable xarray Dataset ({exc})") from exc

    def load(self) -> Any:
        """The Dataset in memory, integrity-checked (crc32c on every chunk); None if empty."""
        ds = self.open()
        if ds is None:
            return None
        try:
            return self.location.retry(ds.load, "read", REWARDS)
        except ValueError as exc:
            raise CorruptObjectError(self.url,
                                     f"a chunk failed its integrity check ({exc})") from exc

    def iterations(self) -> list[int]:
        ds = self.open()
        return [] if ds is None else [int(i) for i in ds["iteration"].values]

    def append(self, iteration: int, columns: Mapping[str, Any]) -> Any:
        """Write the scored samples of ``iteration``; returns that iteration's Dataset.

        ``columns``: equal-length sequences, one entry per sample: ``prompt`` (id), ``seed``,
        ``stage``, ``reward``, ``weights_version`` (``stage``/``weights_version`` may be
        scalars); any other key is an extra numeric column stored as a float64 variable.
        """
        table = _normalise(iteration, columns)
        return self.location.retry(lambda: self._write(iteration, table), "append rewards to",
                                   REWARDS)

    def _write(self, iteration: int, table: dict[str, np.ndarray]) -> Any:
        existing = self.open()
        prompts: list[str] = [] if existing is None else [str(p) for p in existing["prompt"].values]
        old_prompts, old_samples = len(prompts), 0 if existing is None else existing.sizes["sample"]
        for p in table["prompt"]:
            if p not in prompts:
                prompts.append(p)
        slots = _slots(table["prompt"])
        n_samples = max(old_samples, int(slots.max()) + 1)
        extras = [k for k in table if k not in REQUIRED]
        if existing is not None:
            stored = [k for k in existing.data_vars if k != "reward"]
            unknown = sorted(set(extras) - set(stored))
            if unknown:
                raise ValueError(f"rewards columns {unknown} are not in {self.url} (it has "
                                 f"{stored}); extra columns are fixed by the first iteration")
            extras = stored
        ds = _dataset(iteration, table, prompts, n_samples, slots, extras)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_CONSOLIDATED_NOTICE)
            if existing is None:
                encoding = {k: {"compressors": _compressors()} for k in ds.variables}
                ds.to_zarr(self._store(), mode="w", consolidated=True, zarr_format=3,
                           encoding=encoding)
                return ds
            if len(prompts) > old_prompts or n_samples > old_samples:
                self._grow(prompts, n_samples)
            stored_its = [int(i) for i in existing["iteration"].values]
            if iteration in stored_its:
                ds.to_zarr(self._store(), region="auto", consolidated=True)
            elif iteration > max(stored_its):
                ds.to_zarr(self._store(), append_dim="iteration", consolidated=True)
            else:
                raise ValueError(f"iteration {iteration} comes before the last stored iteration "
                                 f"{max(stored_its)} in {self.url}; append iterations in order")
        return ds

    def _grow(self, prompts: list[str], n_samples: int) -> None:
        """Extend the prompt/sample axes in place; old iterations read as empty there."""
        import zarr

        group = zarr.open_group(self._store(), mode="r+", use_consolidated=False)
        for name, arr in group.arrays():
            dims = tuple(arr.metadata.dimension_names or ())
            old = arr.shape
            new = tuple(len(prompts) if d == "prompt" else n_samples if d == "sample" else n
                        for d, n in zip(dims, old))
            if new == old:
                continue
            arr.resize(new)
            if name == "prompt":
                arr[old[0]:] = np.array(prompts[old[0]:], dtype=object)
            elif name == "sample":
                arr[old[0]:] = np.arange(old[0], new[0])
            else:
                fill = _empty_value(arr.dtype)
                for axis, (o, n) in enumerate(zip(old, new)):
                    if n > o:
                        index = tuple(slice(o, n) if a == axis else slice(None)
                                      for a in range(len(new)))
                        arr[index] = fill
        zarr.consolidate_metadata(self._store())


def _compressors() -> tuple:
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return (ZstdCodec(), Crc32cCodec())


def _empty_value(dtype: Any) -> Any:
    kind = np.dtype(dtype).kind if not str(dtype).startswith("StringDType") else "T"
    return np.nan if kind == "f" else MISSING_INT if kind in "iu" else ""


def _normalise(iteration: int, columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
    missing = [k for k in REQUIRED if k not in columns]
    if missing:
        raise ValueError(f"rewards for iteration {iteration} lack columns {missing}; "
                         f"required: {list(REQUIRED)}")
    n = len(columns["reward"])
    if n == 0:
        raise ValueError(f"rewards for iteration {iteration} are empty")
    out: dict[str, np.ndarray] = {}
    for key, value in columns.items():
        if key in ("iteration", "sample"):
            raise ValueError(f"rewards column name {key!r} is reserved")
        scalar = isinstance(value, (str, int, float, np.generic))
        arr = np.full(n, value, dtype=object) if scalar else np.asarray(value, dtype=object)
        if arr.shape != (n,):
            raise ValueError(f"rewards column {key!r} has shape {arr.shape}; expected ({n},) "
                             "like 'reward'")
        out[key] = arr
    out["prompt"] = np.array([str(p) for p in out["prompt"]], dtype=object)
    out["stage"] = np.array([str(s) for s in out["stage"]], dtype=object)
    if any(not s for s in out["stage"]):
        raise ValueError("rewards column 'stage' must not contain empty strings")
    for key in ("seed", "weights_version"):
        out[key] = out[key].astype(np.int64)
    for key in out:
        if key not in ("prompt", "stage", "seed", "weights_version"):
            out[key] = out[key].astype(np.float64)
    return out


def _slots(prompts: Sequence[str]) -> np.ndarray:
    """Slot of each row within its prompt, in order of appearance."""
    seen: dict[str, int] = defaultdict(int)
    slots = np.empty(len(prompts), dtype=np.int64)
    for i, p in enumerate(prompts):
        slots[i] = seen[p]
        seen[p] += 1
    return slots


def _dataset(iteration: int, table: dict[str, np.ndarray], prompts: list[str], n_samples: int,
             slots: np.ndarray, extras: list[str]) -> Any:
    import xarray as xr

    shape = (1, len(prompts), n_samples)
    index = {p: i for i, p in enumerate(prompts)}
    rows = np.array([index[p] for p in table["prompt"]], dtype=np.int64)

    def grid(values: np.ndarray | None, fill: Any, dtype: Any) -> np.ndarray:
        out = np.full(shape, fill, dtype=dtype)
        if values is not None:
            out[0, rows, slots] = values
        return out

    data_vars = {"reward": (DIMS, grid(table["reward"], np.nan, np.float64))}
    for name in extras:
        data_vars[name] = (DIMS, grid(table.get(name), np.nan, np.float64))
    coords = {
        "iteration": [int(iteration)],
        "prompt": np.array(prompts, dtype=object),
        "sample": np.arange(n_samples),
        "seed": (DIMS, grid(table["seed"], MISSING_INT, np.int64)),
        "stage": (DIMS, grid(table["stage"], "", object)),
        "weights_version": (DIMS, grid(table["weights_version"], MISSING_INT, np.int64)),
    }
    ds = xr.Dataset(data_vars, coords=coords)
    ds.attrs["empty_cells"] = "reward NaN, seed -1, weights_version -1, stage ''"
    return ds
