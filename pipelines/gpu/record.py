"""The check's JSON record, written whole and atomically after every measurement: a run cut off
at any point (its time ran out, the process was killed) leaves every figure measured so far.

Layout: ``{"check": {...options, started/finished}, "environment": {...}, "parts": {NAME:
{"status", "seconds", "error"?}}, "steps": {...}, "pipeline": {...}, "determinism": {...},
"collectives": {...}}``.
:func:`expected_keys` lists the dotted keys a finished check holds, per size.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

PARTS = ("steps", "steps-sd35", "pipeline", "determinism", "collectives")
SCALES = {"real": ("512", "1280"), "tiny": ("32", "64")}   # the steps part's resolutions
SD35_SCALES = {"real": ("512", "1024"), "tiny": ("32", "64")}   # the steps-sd35 part's
STEP_KEYS = ("seconds", "predicted_seconds", "seconds_ratio", "peak_gib", "predicted_gib",
             "memory_ratio", "batch", "passes", "image_tokens")
RUN_KEYS = ("equal", "max_abs_diff_latents", "max_abs_diff_log_probs")


class Record:
    """One check's JSON file: read, change, write back atomically (one writer at a time: the
    runner before and after each part, the part's process while it runs)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    def update(self, dotted: str, value: Any) -> dict:
        """Set ``dotted`` (``steps.512.rollout``) to ``value`` and write the file at once."""
        data = self.read()
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _plain(value)
        self.write(data)
        return data

    def write(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(tmp, self.path)

    def merge(self, dotted: str, values: dict) -> dict:
        """Set each of ``values`` under ``dotted``, keeping the keys already there."""
        data = self.read()
        node = data
        for part in dotted.split("."):
            node = node.setdefault(part, {})
        node.update(_plain(values))
        self.write(data)
        return data

    def part_status(self, part: str, status: str, started: float, **info: Any) -> None:
        """A part's outcome (``done``, ``failed``, ``timeout``, ``running``) and its seconds,
        beside what the part wrote there itself (its error)."""
        self.merge(f"parts.{part}", {"status": status,
                                     "seconds": round(time.time() - started, 2), **info})


def parse_shapes(text: str) -> tuple[str, ...]:
    """``--shapes 1024x4,768x2``: extra (side, batch) shapes for the steps part, each checked."""
    shapes = tuple(s.strip() for s in text.split(",") if s.strip())
    for shape in shapes:
        side, _, batch = shape.partition("x")
        if not (side.isdigit() and batch.isdigit() and int(side) % 16 == 0 and int(side) > 0
                and int(batch) >= 2):
            raise ValueError(f"--shapes {text!r}: {shape!r} is not SIDExBATCH with a side that "
                             "is a multiple of 16 and a batch of at least 2 (a GRPO group), "
                             "e.g. 1024x4")
    return shapes


def _plain(value: Any) -> Any:
    """JSON-safe: numpy scalars as numbers, NaN/inf as null, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def ratio(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted, or None when either is missing or the prediction is 0."""
    if measured is None or not predicted:
        return None
    return measured / predicted


def expected_keys(size: str) -> list[str]:
    """Every dotted key a finished check of ``size`` ('real' or 'tiny') writes."""
    keys = ["check.size", "check.device", "check.finished_at", "environment.torch",
            "environment.device_name", "steps.model.transformer_params",
            "steps.model.predicted_transformer_params", "steps.model.build_seconds",
            "pipeline.iterations.completed", "pipeline.iterations.seconds",
            "pipeline.iterations.workers_device", "pipeline.preempt_resume.preempted",
            "pipeline.preempt_resume.resumed_from", "pipeline.preempt_resume.equal",
            "pipeline.preempt_resume.max_abs_diff"]
    keys += [f"parts.{p}.status" for p in PARTS]
    keys += ["collectives.group.backend", "collectives.group.all_reduce_ok"]
    keys += [f"collectives.sharded_{dtype}.{k}" for dtype in ("fp32", "bf16")
             for k in ("max_abs_diff", "seconds")]
    for section, scales in (("steps", SCALES), ("steps_sd35", SD35_SCALES)):
        keys += [f"{section}.model.transformer_params"]
        keys += [f"{section}.{scale}.{kind}.{k}" for scale in scales[size]
                 for kind in ("rollout", "train") for k in STEP_KEYS]
    for mode in ("default", "deterministic"):
        keys += [f"determinism.{mode}.{run}.{k}" for run in ("rerun", "resume")
                 for k in RUN_KEYS]
    return keys


def missing_keys(data: dict, size: str) -> list[str]:
    """The expected keys ``data`` lacks (present with a null value counts as present)."""
    missing = []
    for dotted in expected_keys(size):
        node: Any = data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(dotted)
                break
            node = node[part]
    return missing


def summary(data: dict) -> list[str]:
    """A few lines of the figures that matter, for the console."""
    lines = []
    for section, scale, kind, step in _steps(data):
        lines.append(f"{section} {scale} {kind}: {_num(step.get('seconds'))} s "
                     f"(predicted {_num(step.get('predicted_seconds'))}, ratio "
                     f"{_num(step.get('seconds_ratio'))}); peak {_num(step.get('peak_gib'))} "
                     f"GiB (predicted {_num(step.get('predicted_gib'))}, ratio "
                     f"{_num(step.get('memory_ratio'))})"
                     + (" OUT OF MEMORY" if step.get("oom") else ""))
    pipeline = data.get("pipeline") or {}
    if "iterations" in pipeline:
        lines.append(f"pipeline: {pipeline['iterations'].get('completed')} iterations in "
                     f"{[_num(s) for s in pipeline['iterations'].get('seconds', [])]} s")
    if "preempt_resume" in pipeline:
        p = pipeline["preempt_resume"]
        lines.append(f"preempt/resume: preempted {p.get('preempted')}, resumed from "
                     f"{p.get('resumed_from')}, equal {p.get('equal')}, max diff "
                     f"{p.get('max_abs_diff')}")
    collectives = data.get("collectives") or {}
    if "group" in collectives:
        group = collectives["group"]
        lines.append(f"collectives: {group.get('backend')} group of {group.get('world')} on "
                     f"{group.get('device')}, all-reduce ok {group.get('all_reduce_ok')}")
    for dtype in ("fp32", "bf16"):
        step = collectives.get(f"sharded_{dtype}") or {}
        if step:
            lines.append(f"sharded step ({dtype} compute): max gradient diff "
                         f"{_num(step.get('max_abs_diff'))}, {_num(step.get('seconds'))} s")
    for mode in ("default", "deterministic"):
        runs = (data.get("determinism") or {}).get(mode) or {}
        lines += [f"determinism {mode} {run}: equal {r.get('equal')}, max diff latents "
                  f"{r.get('max_abs_diff_latents')}, log-probs {r.get('max_abs_diff_log_probs')}"
                  for run, r in sorted(runs.items()) if isinstance(r, dict)]
    return lines


def _steps(data: dict):
    """(section, scale, kind, step) of every measured step, in order."""
    for section in ("steps", "steps_sd35"):
        for scale, kinds in sorted((data.get(section) or {}).items()):
            for kind, step in sorted(kinds.items()) if scale != "model" else []:
                yield section, scale, kind, step


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"
