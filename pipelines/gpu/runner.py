"""Runs the check's parts one after another, each in a process of its own with a time limit,
and records how each ended. Only the standard library here: the command line imports this
module when it builds its parser, and a part's process does the heavy imports.

A part whose time runs out is killed with everything it started (its process group: the
pipeline part's Dask workers too); what it wrote before stays in the record, marked
``timeout``. The next part still runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.gpu.record import PARTS, Record, missing_keys, summary

PROJECT = Path(__file__).resolve().parents[2]
# cuBLAS needs a fixed workspace to be deterministic; set before the part's first CUDA call.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@dataclass(frozen=True)
class CheckOptions:
    json: Path
    size: str                 # 'real' or 'tiny'
    device: str               # 'cuda', 'cuda:N' or 'cpu' (resolved)
    parts: tuple[str, ...]
    timeout_per_part_s: float
    work_dir: Path | None = None
    shapes: tuple[str, ...] = ()   # the steps part's extra SIDExBATCH shapes


def parse_parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"--sections {text!r}: unknown {unknown}; choose from {list(PARTS)} "
                         "(comma-separated)")
    return parts


def run_check(options: CheckOptions) -> int:
    """Every part in order; 0 when each finished, 1 otherwise (the record says which)."""
    record = Record(options.json)
    record.write({"check": {"size": options.size, "device": options.device,
                            "parts": list(options.parts), "shapes": list(options.shapes),
                            "started_at": _now(),
                            "finished_at": None,
                            "timeout_per_part_s": options.timeout_per_part_s}})
    statuses = {}
    for part in options.parts:
        statuses[part] = run_part(record, options, part)
        print(f"check-gpu: {part}: {statuses[part]}", flush=True)
    record.update("check.finished_at", _now())
    missing = missing_keys(record.read(), options.size) if options.parts == PARTS else []
    data = record.update("check.missing_keys", missing)
    for line in summary(data):
        print(f"check-gpu: {line}")
    print(f"check-gpu: wrote {options.json}" + (f"; missing {missing}" if missing else ""))
    return 0 if all(s == "done" for s in statuses.values()) else 1


def run_part(record: Record, options: CheckOptions, part: str) -> str:
    """One part in its own process group; its output goes to a log beside the record."""
    started = time.time()
    record.part_status(part, "running", started)
    log = options.json.with_name(f"{options.json.stem}.{part}.log")
    command = [sys.executable, "-m", "pipelines.gpu.part", part, "--json", str(options.json),
               "--size", options.size, "--device", options.device]
    if options.work_dir is not None:
        command += ["--folder", str(options.work_dir)]
    if part == "steps" and options.shapes:
        command += ["--shapes", ",".join(options.shapes)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PROJECT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    if part == "determinism":
        env = {**DETERMINISTIC_ENV, **env}
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=options.timeout_per_part_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            record.part_status(part, "timeout", started, log=str(log))
            return "timeout"
    status = "done" if code == 0 else "failed"
    record.part_status(part, status, started, exit_code=code, log=str(log))
    if code != 0:
        print(f"check-gpu: {part} failed (exit {code}); the end of {log}:\n"
              + "\n".join(log.read_text().splitlines()[-15:]), file=sys.stderr)
    return status


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
