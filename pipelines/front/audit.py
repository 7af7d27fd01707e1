"""Audit a run from its store alone: a per-iteration table, and one request's latent strip.

Both read only what the run store committed (manifest, rewards.zarr, latent commit markers);
they never write to the run. The CLI (``spotlight audit RUN_URL``) is a thin layer over
:func:`audit_table` and :func:`request_strip`.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

import numpy as np

from spotlight.config import from_stored
from spotlight.models.base import latent_decoder
from storage import RunStore, StorageConfig
from storage.errors import NotCommittedError
from storage.manifest import iteration_dir, stage_iteration

STAGES = ("explore", "rollout", "validation")
_ITER_DIR = re.compile(r"^iter-(\d{6})$")


class AuditTable(str):
    """The rendered table (a ``str``) carrying its rows as data in ``.rows``."""

    rows: list[dict[str, Any]]

    def __new__(cls, text: str, rows: list[dict[str, Any]]) -> "AuditTable":
        obj = super().__new__(cls, text)
        obj.rows = rows
        return obj


def _open(run: str | StorageConfig | RunStore) -> RunStore:
    return run if isinstance(run, RunStore) else RunStore.open(run, create=False)


def audit_rows(run: str | StorageConfig | RunStore) -> list[dict[str, Any]]:
    """One dict per iteration: reward mean/std/n per stage, requests, resumes, preemptions,
    completed stages and checkpoint. Missing facts are None."""
    store = _open(run)
    manifest = store.manifest.read()
    rows: dict[int, dict[str, Any]] = {}

    def row(it: int) -> dict[str, Any]:
        if it not in rows:
            rows[it] = {"iteration": it, "requests": 0, "requests_complete": 0, "resumes": 0,
                        "preemptions": None, "stages_done": [], "checkpoint": None}
            for stage in STAGES:
                rows[it].update({f"{stage}_mean": None, f"{stage}_std": None, f"{stage}_n": 0})
        return rows[it]

    _reward_stats(store, row)
    for name, record in sorted(manifest.get("stages", {}).items()):
        it = stage_iteration(name)
        if it is None:
            continue
        r = row(it)
        r["stages_done"].append(name.split("/", 1)[1] if "/" in name else name)
        pre = (record.get("info") or {}).get("preemptions")
        if isinstance(pre, (int, float)):
            r["preemptions"] = (r["preemptions"] or 0) + int(pre)
    for record in manifest.get("checkpoints", {}).values():
        row(int(record["iteration"]))["checkpoint"] = int(record["weights_version"])
    for name in store.location.list_names():
        m = _ITER_DIR.match(name)
        if m:
            _request_stats(store, name, row(int(m.group(1))))
    return [rows[k] for k in sorted(rows)]


def _reward_stats(store: RunStore, row: Callable[[int], dict]) -> None:
    ds = store.rewards.load()
    if ds is None:
        return
    stages = ds["stage"].values
    rewards = ds["reward"].values
    for i, it in enumerate(ds["iteration"].values):
        r = row(int(it))
        for stage in STAGES:
            values = rewards[i][(stages[i] == stage) & np.isfinite(rewards[i])]
            if values.size:
                r[f"{stage}_mean"] = float(values.mean())
                r[f"{stage}_std"] = float(values.std())
                r[f"{stage}_n"] = int(values.size)


def _request_stats(store: RunStore, iter_name: str, r: dict[str, Any]) -> None:
    for entry in store.location.list_names(iter_name):
        if not entry.endswith(".zarr"):
            continue
        stage = f"{iter_name}/{entry[:-len('.zarr')]}"
        for request in store.latents.requests(stage):
            record = store.latents.commit_record(stage, request)
            r["requests"] += 1
            if record is None:
                continue
            r["resumes"] += len(record.get("resumes", []))
            if int(record["step"]) >= int(record["num_steps"]):
                r["requests_complete"] += 1


def _fmt_reward(r: dict[str, Any], stage: str) -> str:
    if r[f"{stage}_mean"] is None:
        return "-"
    return f"{r[stage + '_mean']:.3f}±{r[stage + '_std']:.3f} ({r[stage + '_n']})"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """Render audit rows as a fixed-width text table."""
    header = ["iter", *STAGES, "requests", "resumes", "preempt", "checkpoint", "stages done"]
    body = []
    for r in rows:
        body.append([
            str(r["iteration"]), *[_fmt_reward(r, s) for s in STAGES],
            f"{r['requests_complete']}/{r['requests']}", str(r["resumes"]),
            "-" if r["preemptions"] is None else str(r["preemptions"]),
            "-" if r["checkpoint"] is None else f"v{r['checkpoint']}",
            ",".join(r["stages_done"]) or "-",
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    if not body:
        lines.append("(no iterations recorded yet)")
    return "\n".join(lines)


def audit_table(run: str | StorageConfig | RunStore) -> AuditTable:
    """The per-iteration audit of a run as text; ``.rows`` holds the same facts as dicts.

    Columns: reward mean±std (n) for explore/rollout/validation, requests complete/total,
    resumes (requests picked up from a committed step), preemptions (from stage records'
    ``info["preemptions"]``), the checkpoint's weights version, and completed stages.
    """
    rows = audit_rows(run)
    return AuditTable(format_rows(rows), rows)


# -- one request's trajectory -------------------------------------------------------------------
def latent_heatmap(latent: np.ndarray) -> np.ndarray:
    """Default decoder: a latent as a grey (H, W, 3) image, min-max normalised.

    Assumes nothing about the latent's meaning: (tokens, channels) becomes tokens rows by
    channels columns; a vector one row; more dims are flattened after the first.
    """
    a = np.asarray(latent, dtype=np.float64)
    a = a.reshape(1, -1) if a.ndim <= 1 else a.reshape(a.shape[0], -1)
    finite = np.isfinite(a)
    lo, hi = (a[finite].min(), a[finite].max()) if finite.any() else (0.0, 0.0)
    grey = np.full(a.shape, 0.5) if hi <= lo else (a - lo) / (hi - lo)
    grey = np.where(finite, grey, 0.0)
    return np.repeat(grey[..., None], 3, axis=2)


def decoder_for_run(run: str | StorageConfig | RunStore) -> Callable[[np.ndarray], np.ndarray]:
    """How the run's policy shows a stored latent (digits: its canvases; qwen-image: VAE-decoded
    images), falling back to :func:`latent_heatmap` for latents it cannot take or for a run
    without a recorded config."""
    store = _open(run)
    recorded = store.manifest.read().get("run", {}).get("config")
    if not recorded:
        return latent_heatmap
    decode = latent_decoder(from_stored(recorded, store.url))
    if decode is None:
        return latent_heatmap

    def decode_or_heatmap(latent: np.ndarray) -> np.ndarray:
        try:
            return decode(latent)
        except ValueError:   # not a latent of this policy's shape
            return latent_heatmap(latent)

    return decode_or_heatmap


def _find_stage(store: RunStore, iteration: int, request: str) -> str:
    it = iteration_dir(iteration)
    present = [e[:-5] for e in store.location.list_names(it) if e.endswith(".zarr")]
    ordered = [s for s in ("rollout", "explore", "validation") if s in present]
    ordered += [s for s in present if s not in ordered]
    for stage in ordered:
        if store.latents.committed_step(f"{it}/{stage}", request) >= 0:
            return f"{it}/{stage}"
    raise NotCommittedError(f"request {request!r} has no committed latents in iteration "
                            f"{iteration} of {store.url} (stages there: {present or 'none'})")


def request_strip(run: str | StorageConfig | RunStore, iteration: int, request: str | int,
                  out_png: str | os.PathLike,
                  decode: Callable[[np.ndarray], np.ndarray] | None = None,
                  *, stage: str | None = None, min_height: int = 96) -> np.ndarray:
    """Decode every committed step of one request into a left-to-right PNG strip.

    ``decode`` maps a latent to an (H, W, 3) float image in [0, 1] (a policy's VAE/unpacking);
    the default :func:`latent_heatmap` shows the raw latent. ``stage`` (e.g. ``"rollout"``)
    defaults to the first stage of the iteration that holds the request. Returns the strip.
    """
    from PIL import Image

    store = _open(run)
    stage_name = f"{iteration_dir(iteration)}/{stage}" if stage else \
        _find_stage(store, iteration, str(request))
    latents = store.latents.read_trajectory(stage_name, request)
    decode = decode or latent_heatmap
    frames = []
    for step, latent in enumerate(latents):
        img = np.asarray(decode(latent), dtype=np.float64)
        if img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"decode returned shape {img.shape} for step {step}; expected an "
                             "(H, W, 3) image with values in [0, 1]")
        frames.append(np.clip(np.nan_to_num(img), 0.0, 1.0))
    height = max(f.shape[0] for f in frames)
    scale = max(1, min(16, math.ceil(min_height / height)))
    gap = np.ones((height * scale, 2, 3))
    parts = []
    for f in frames:
        padded = np.ones((height, f.shape[1], 3))
        padded[:f.shape[0]] = f
        parts += [np.kron(padded, np.ones((scale, scale, 1))), gap]
    strip = np.concatenate(parts[:-1], axis=1)
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    Image.fromarray((strip * 255).round().astype(np.uint8)).save(out_png)
    return strip


def format_events(events: list[dict[str, Any]]) -> str:
    """The run's event log, one line each: UTC time, what happened, to which worker / request."""
    import datetime

    if not events:
        return "no events recorded (no preemption, injection or spot dispatch in this run)"
    lines = []
    for e in events:
        at = datetime.datetime.fromtimestamp(e.get("at", 0.0), datetime.timezone.utc)
        what = f"{e.get('kind', '?')}/{e['what']}" if e.get("what") else e.get("kind", "?")
        detail = " ".join(f"{k}={e[k]}" for k in ("stage", "worker", "request", "attempt", "step",
                                                   "hard", "source", "reason", "waiting",
                                                   "epoch", "host", "pid")
                          if e.get(k) is not None and e.get(k) != "")
        old = e.get("took_over_from")
        if isinstance(old, dict):   # a lease taken from another driver
            detail += f" took_over_from={old.get('host')}:{old.get('pid')}@{old.get('epoch')}"
        lines.append(f"{at:%H:%M:%S.%f}"[:-3] + f"  {what:<22} {detail}")
    return "\n".join(lines)

