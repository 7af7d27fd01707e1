"""One part of ``spotlight check-gpu`` in a process of its own (started by :mod:`.runner`):

    python -m pipelines.gpu.part PART --json PATH --size S --device D [--shapes 1024x4,768x2]

(PART: steps, steps-sd35, pipeline, determinism or collectives).

It writes the environment it runs in (once per check), then its figures as it measures them;
a failure is written as the part's error, with the last lines of its traceback.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import traceback
from importlib import metadata
from pathlib import Path

import torch

from pipelines.gpu.collectives import run_collectives
from pipelines.gpu.determinism import run_determinism
from pipelines.gpu.pipeline import run_pipeline
from pipelines.gpu.record import PARTS, Record, parse_shapes
from pipelines.gpu.step_models import MODELS
from pipelines.gpu.steps import run_steps
from spotlight.sizing import GIB

PACKAGES = ("torch", "diffusers", "transformers", "peft", "dask", "distributed", "zarr",
            "numcodecs", "numpy", "fsspec", "xarray")


def environment(device: str) -> dict:
    """What the figures were measured on: versions, the device, its memory."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    where = torch.device(device)
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "packages": versions, "device": str(where),
           "device_name": platform.processor() or platform.machine(), "device_memory_gib": None}
    if where.type == "cuda":
        props = torch.cuda.get_device_properties(where)
        out.update(device_name=props.name, device_memory_gib=props.total_memory / GIB,
                   capability=f"{props.major}.{props.minor}",
                   multiprocessors=props.multi_processor_count)
    return out


def run_part(part: str, record: Record, size: str, device: str, folder: Path,
             shapes: tuple[str, ...] = ()) -> None:
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)   # as a CPU worker runs (cluster.threads_per_worker)
    if "environment" not in record.read():
        record.update("environment", environment(device))
    if part == "steps":
        run_steps(record, size, device, shapes)
    elif part == "steps-sd35":
        run_steps(record, size, device, (), MODELS["sd3.5"])
    elif part == "pipeline":
        run_pipeline(record, device, folder)
    elif part == "determinism":
        run_determinism(record, size, device)
    elif part == "collectives":
        run_collectives(record, device)
    else:
        raise ValueError(f"unknown check-gpu part {part!r}; choose one of {list(PARTS)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.gpu.part")
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--json", required=True)
    parser.add_argument("--size", choices=("tiny", "real"), required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--folder", default=None, help="where the pipeline part's run store goes")
    parser.add_argument("--shapes", default="", help="the steps part's extra SIDExBATCH shapes")
    args = parser.parse_args(argv)
    record = Record(args.json)
    try:
        with tempfile.TemporaryDirectory(prefix="check-gpu-", dir=args.folder) as folder:
            run_part(args.part, record, args.size, args.device, Path(folder),
                     parse_shapes(args.shapes))
    except BaseException as err:  # noqa: BLE001 - every failure goes into the record
        record.merge(f"parts.{args.part}", {
            "error": f"{type(err).__name__}: {err}"[:1000],
            "traceback": traceback.format_exc().splitlines()[-12:]})
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
