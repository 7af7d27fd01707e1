"""The repository's Dockerfile against the project: the torch pin of pyproject.toml, every
package it installs, the entry points the deploy recipes run, and the CUDA build argument the
CLI prints. (No image is built here.)"""
from __future__ import annotations

import importlib.metadata
import re

import pytest
import tomllib

from pipelines.deploy.cli import CUDA_BUILD_ARG
from pipelines.deploy.kubernetes import PROVIDERS, KubeOptions, scheduler_args, worker_args
from spotlight.config import PROJECT_ROOT

DOCKERFILE = (PROJECT_ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (PROJECT_ROOT / ".dockerignore").read_text()
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [tuple(line.split(None, 1)) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def of(kind: str) -> list[str]:
    return [args for instruction, args in instructions() if instruction == kind]


def test_torch_is_installed_first_with_the_pin_of_pyproject():
    (pin,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")]
    runs = of("RUN")
    torch = [i for i, run in enumerate(runs) if f"pip install {pin} " in run + " "]
    project = [i for i, run in enumerate(runs) if "pip install . " in run + " "]
    assert len(torch) == 1 and len(project) == 1 and torch[0] < project[0]
    assert '--index-url "$TORCH_INDEX_URL"' in runs[torch[0]]


def test_the_cpu_and_cuda_variants_are_one_build_argument():
    (arg,) = of("ARG")
    name, default = arg.split("=", 1)
    assert name == "TORCH_INDEX_URL" and default.endswith("/whl/cpu")
    assert CUDA_BUILD_ARG.split("=", 1)[0] == name   # what `deploy kubernetes` prints
    assert f"--build-arg {CUDA_BUILD_ARG}" in DOCKERFILE   # and the header documents


def test_every_package_of_the_project_is_copied_and_let_through_the_ignore_file():
    packages = {p.rstrip("*")
                for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {args.split()[0] for args in of("COPY")}
    assert packages | {"pyproject.toml", "configs"} == copied
    allowed = {line[1:] for line in DOCKERIGNORE.splitlines() if line.startswith("!")}
    assert allowed == copied and DOCKERIGNORE.splitlines().count("*") == 1


def test_the_entry_points_are_the_projects_and_dasks():
    assert of("ENTRYPOINT") == ['["tini", "--"]']   # exec form: the command is PID 1's child
    (cmd,) = of("CMD")
    assert cmd == '["spotlight", "--help"]'
    assert PYPROJECT["project"]["scripts"] == {"spotlight": "spotlight:main"}
    dask_commands = {e.name for e in importlib.metadata.entry_points(group="dask_cli")}
    opts = KubeOptions(image="spotlight:cpu", spot_nodes=PROVIDERS["gke"])
    for args in (worker_args(opts, "gpu"), scheduler_args(opts)):
        assert args[0] == "dask" and args[1] in dask_commands


@pytest.mark.parametrize("module", ["spotlight", "storage", "pipelines.cluster.cloud_class",
                                    "pipelines.run.tasks"])
def test_the_build_checks_the_imports_a_worker_needs(module):
    (check,) = [run for run in of("RUN") if "python -c" in run and "import" in run]
    assert module in check
