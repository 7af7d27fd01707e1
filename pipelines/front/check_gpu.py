"""``spotlight check-gpu``: measure what Spotlight does on this machine's GPU against what the
sizing model (``spotlight run --dry-run``) predicts, run the pipeline there, and measure how
deterministic the device is -- every figure into one JSON file as soon as it is measured.

    spotlight check-gpu --json check-gpu.json                 # real size on CUDA, tiny on CPU
    python -m pipelines.front.check_gpu --json out.json --sections steps

The parts (:mod:`pipelines.gpu`) each run in a process of their own with ``--timeout-per-part``
seconds; a part that fails or runs out of time leaves what it measured and the rest still run.
On a bare GPU machine, bring the missing packages first: ``python -m pipelines.gpu.bundle``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.gpu.record import PARTS, parse_shapes
from pipelines.gpu.runner import CheckOptions, parse_parts, run_check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default="check-gpu.json", metavar="PATH",
                   help="the record to write (rewritten after every measurement; default "
                        "check-gpu.json); each part's log goes beside it")
    p.add_argument("--size", choices=("real", "tiny"), default=None,
                   help="real: Qwen-Image's transformer at its published size (20.4 B, bf16, "
                        "random weights) at 512² and 1280², SD3.5-Medium's at 512² and 1024²; "
                        "tiny: the tiny components (the CPU test). Default: real on CUDA, tiny "
                        "on the CPU")
    p.add_argument("--device", default="auto",
                   help="cuda, cuda:N or cpu (default auto: cuda where there is one)")
    p.add_argument("--sections", default=",".join(PARTS), metavar="P1,P2",
                   help=f"the parts to run, of {','.join(PARTS)} (default: all)")
    p.add_argument("--shapes", default="", metavar="SIDExBATCH,...",
                   help="extra shapes for the steps part beyond the configs' (e.g. 1024x4,768x2: "
                        "the first config's settings at that side, rollout batch and micro-batch "
                        "BATCH), to check the sizing model away from the points it was fitted on")
    p.add_argument("--timeout-per-part", type=float, default=600.0, metavar="SECONDS",
                   help="a part still running after this long is killed (default 600)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="where the pipeline part keeps its run store (default: a temporary "
                        "folder, removed after)")
    p.set_defaults(func=run)


def resolve(device: str, size: str | None) -> tuple[str, str]:
    """(device, size): 'auto' is CUDA where torch sees a GPU; the size follows the device."""
    import torch  # only here: building the command line must not load torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch {torch.__version__} sees no CUDA device; "
                         "use --device cpu (with --size tiny)")
    return device, size or ("real" if device.startswith("cuda") else "tiny")


def run(args: argparse.Namespace) -> int:
    if args.timeout_per_part <= 0:
        raise ValueError(f"--timeout-per-part {args.timeout_per_part:g}: a number of seconds "
                         "> 0 is expected")
    shapes = parse_shapes(args.shapes)
    device, size = resolve(args.device, args.size)
    print(f"check-gpu: size {size} on {device}; writing {args.json}", flush=True)
    return run_check(CheckOptions(Path(args.json).resolve(), size, device,
                                  parse_parts(args.sections), args.timeout_per_part,
                                  Path(args.work_dir).resolve() if args.work_dir else None,
                                  shapes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.front.check_gpu",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
