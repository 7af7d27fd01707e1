"""The wheels ``spotlight check-gpu`` needs on a GPU machine whose image lacks them, gathered
here for the device's Python, and the one command that installs them there and runs the check.

    python -m pipelines.gpu.bundle --out .whl          # download, check the size, print the command
    python -m pipelines.gpu.bundle --list              # only say what would be downloaded

The lent GPU machines (``nvidia-h100-x1``, ``nvidia-h200``) reach no package index; their image
has Python 3.12 with torch 2.11 (CUDA), transformers, peft, fsspec, xarray, numpy and the
packages in :data:`DEVICE_HAS`. What the check imports beyond those is :data:`ROOTS` and their
requirements, walked through this environment's installed metadata (markers evaluated for the
device's Python) and pinned to the versions installed here, which the test suite runs with.
Wheels are installed with ``--no-deps`` against the device's own torch; the working tree and the
wheels travel together, 64 MiB in all.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOTS = ("diffusers", "dask", "distributed", "zarr", "tensorboardX")
# The device image's packages (its package list, 2026-11); a name here is never downloaded.
DEVICE_HAS = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp""".split())
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
TRAVEL_MIB = 64   # working tree + carried wheels, per device call
MIB = 1024 ** 2


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots=ROOTS, have=DEVICE_HAS, python: str = DEVICE_PYTHON) -> dict[str, str]:
    """name -> installed version of every package ``roots`` need that ``have`` lacks."""
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    have = {canonical(n) for n in have}
    pins: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if canonical(name) in have or canonical(name) in pins:
            continue
        try:
            pins[canonical(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"bundle: {name} is needed on the device but not installed here; "
                             "install the project first (make install)") from None
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return dict(sorted(pins.items()))


def download(pins: dict[str, str], out: Path, python: str = DEVICE_PYTHON) -> list[Path]:
    """Binary wheels of ``pins`` for the device's Python and platform, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
               "--dest", str(out)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [f"{n}=={v}" for n, v in pins.items()], check=True)
    wheels = sorted(out.glob("*.whl"))
    wanted = {canonical(n) for n in pins}
    stray = [w.name for w in wheels if canonical(w.name.split("-")[0]) not in wanted]
    if stray:
        raise SystemExit(f"bundle: {out} holds other wheels too {stray}: two versions of one "
                         "package stop the install there; use an empty folder")
    return wheels


def device_command(out: str = ".whl", json_path: str = "$OUT/check-gpu.json",
                   timeout_per_part: int = 180) -> str:
    """The one line to run on the GPU machine from the repository root, ``out`` carried."""
    return (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
            f"--target /tmp/site {out}/*.whl && export PYTHONPATH=$PWD:/tmp/site "
            f"PYTHONUNBUFFERED=1 && python3 -m pipelines.front.check_gpu --json {json_path} "
            f"--timeout-per-part {timeout_per_part}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.gpu.bundle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".whl", help="folder for the wheels (default .whl; "
                        "keep it out of git: echo /.whl/ >> .git/info/exclude)")
    parser.add_argument("--python-version", default=DEVICE_PYTHON,
                        help=f"the device's Python (default {DEVICE_PYTHON})")
    parser.add_argument("--max-mib", type=float, default=48.0,
                        help=f"refuse a bundle larger than this (default 48: the working tree "
                             f"travels in the same {TRAVEL_MIB} MiB)")
    parser.add_argument("--list", action="store_true", help="print the pins; download nothing")
    args = parser.parse_args(argv)
    pins = closure(python=args.python_version)
    print("bundle: " + " ".join(f"{n}=={v}" for n, v in pins.items()))
    if args.list:
        return 0
    wheels = download(pins, Path(args.out), args.python_version)
    total = sum(w.stat().st_size for w in wheels) / MIB
    print(f"bundle: {len(wheels)} wheels, {total:.1f} MiB in {args.out}")
    if total > args.max_mib:
        print(f"bundle: {total:.1f} MiB is over --max-mib {args.max_mib:g}", file=sys.stderr)
        return 1
    print(f"on the device (carry {args.out!r}):\n{device_command(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
