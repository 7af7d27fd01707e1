"""A convergence bench's own base model and reward model, kept with its saved parts.

The digits base is pretrained here for a fixed number of steps, and the recogniser that scores
OCR and GenEval is trained here too; another CPU sums in another order and ends with other
weights (the GenEval base validated 0.251, 0.261 and 0.269 on three machines), so a bench
resumed elsewhere would start its new seeds from another model than its saved ones, against
targets set from the first. So the bench copies both into ``PARTS/models`` before its first
job, with every file's sha256 and the base's validation as measured there
(``shipped.json``, written last). A bench that finds them uses them through
``$SPOTLIGHT_MODELS`` (:func:`spotlight.cache.model_dir`) and takes the recorded validation:
it resumes from the same weights on any machine, and pretrains nothing.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from spotlight.cache import MODELS_ENV, cache_dir, write_atomically
from spotlight.config import RunConfig
from spotlight.models.base import base_policy
from spotlight.models.pretrain import base_model_dir
from spotlight.rewards import build_reward
from spotlight.rewards.recognizer import recognizer_dir

RECORD = "shipped.json"


@dataclass(frozen=True)
class ShippedModels:
    """What ``shipped.json`` holds: the models' files and hashes, and the base's validation."""

    base_val_reward: float
    base_val_standard_error: float
    files: dict[str, str]   # path under the models folder -> sha256
    made_on: str            # the CPU that trained them, as a reader would want to know


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` except the record itself."""
    hashes = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD):
        hashes[path.relative_to(folder).as_posix()] = hashlib.sha256(
            path.read_bytes()).hexdigest()
    return hashes


def model_names(config: RunConfig) -> list[str]:
    """The folder names of the trained models ``config``'s runs load: its base, its recogniser."""
    return [base_model_dir(config).name,
            recognizer_dir(config.reward.recognizer_epochs, config.reward.recognizer_seed).name]


def read_shipped(folder: Path) -> ShippedModels | None:
    """The models kept in ``folder``, each file checked against its recorded hash; None if the
    folder holds none. A changed or missing file is refused by name: resuming from other
    weights than the saved parts came from would mix two baselines."""
    record = folder / RECORD
    if not record.is_file():
        return None
    shipped = ShippedModels(**json.loads(record.read_text()))
    found = file_hashes(folder)
    for name, digest in shipped.files.items():
        if found.get(name) != digest:
            state = "is missing" if name not in found else f"has sha256 {found[name][:12]}…"
            raise ValueError(
                f"{folder / name} {state}, but the bench recorded {digest[:12]}… in "
                f"{record}: the saved parts were measured from that model. Restore the folder "
                "as the bench left it (from the repository, if it was committed), or start the "
                "bench in a new folder")
    return shipped


@contextlib.contextmanager
def models_from(folder: Path | None) -> Iterator[None]:
    """Runs inside load their trained models from ``folder`` (None: this machine's cache), this
    process and the workers it starts, which inherit the environment; the setting before is
    restored after."""
    before = os.environ.pop(MODELS_ENV, None)
    if folder is not None:
        os.environ[MODELS_ENV] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MODELS_ENV, None)
        else:
            os.environ[MODELS_ENV] = before


def ship_models(folder: Path, config: RunConfig,
                validate_base: Callable[[], tuple[float, float]]) -> ShippedModels:
    """Keep ``config``'s trained models in ``folder`` (once), or check the ones kept there.

    First time: the models are built in this machine's cache as any run builds them, copied
    into ``folder``, validated from there (``validate_base`` -> reward, standard error) and
    recorded. Later, on any machine: the kept files are checked and their record returned.
    Call it, and run the bench, inside :func:`models_from` ``(folder)``."""
    shipped = read_shipped(folder)
    if shipped is not None:
        return shipped
    folder.mkdir(parents=True, exist_ok=True)
    names = model_names(config)
    with models_from(None):
        _build(config)
    for name in names:
        source = cache_dir() / name
        if source.is_dir() and not (folder / name).exists():
            partial = folder / f".{name}.copying"   # renamed whole: never half a model
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
            partial.rename(folder / name)
    reward, standard_error = validate_base()
    shipped = ShippedModels(base_val_reward=reward, base_val_standard_error=standard_error,
                            files=file_hashes(folder), made_on=_cpu())
    write_atomically(folder / RECORD,   # the commit: written last, whole
                     lambda f: Path(f).write_text(json.dumps(asdict(shipped), indent=1)))
    return shipped


def _build(config: RunConfig) -> None:
    """Pretrain (or find cached) the base and train (or find) the recogniser."""
    base_policy(config, progress=False)
    build_reward(config.reward)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
