"""What `pip install /path/to/spotlight` (not editable, as the cluster guide installs every VM)
gives: the packages and the shipped configs, found from any folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from spotlight.config import DISTRIBUTION, shipped_root

ROOT = Path(__file__).resolve().parents[1]


def test_the_configs_come_from_the_checkout_or_from_the_installs_prefix(tmp_path):
    assert shipped_root() == ROOT   # the suite runs from a checkout
    installed = tmp_path / "env/lib/python3/site-packages/spotlight/config/__init__.py"
    assert shipped_root(str(installed), str(tmp_path / "env")) == \
        tmp_path / "env" / "share" / DISTRIBUTION


def test_a_non_editable_install_runs_its_default_config_from_any_folder(tmp_path):
    wheels, env, source = tmp_path / "wheels", tmp_path / "env", tmp_path / "source"
    # Built from a copy: setuptools leaves its build folder beside the sources.
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "runs", "reports", "docs", "tests", "mutants"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(source), "-w", str(wheels)], check=True,
                   capture_output=True, timeout=300)
    subprocess.run([sys._base_executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # The dependencies from this environment; a folder named in a .pth file is searched, its
    # own .pth files (this checkout's editable install) are not run.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], check=True, capture_output=True,
                   timeout=300)
    code = ("import argparse, spotlight.config as c; from pipelines.front.cli import "
            "config_path; path = config_path(argparse.Namespace(config=None)); "
            "config = c.load_config(path); print(c.__file__); print(path); "
            "print(config.world.task, config.world.train_prompts)")
    done = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    module, path, loaded = done.stdout.strip().splitlines()
    assert module.startswith(str(site)), module   # the installed copy, not this checkout
    assert path == str(env / "share" / DISTRIBUTION / "configs" / "digits.yaml")
    assert loaded.startswith("ocr ") and "share/spotlight-dit/configs/prompts" in loaded
