"""Experiment tracking: which trackers a run writes its curves to, and where their files go.

TensorBoard is always available (``tensorboardX`` is a dependency); Weights & Biases, MLflow
and trackio come with ``pip install -e '.[tracking]'`` in the checkout. Every tracker works
offline by default, so a run on a cluster without internet access still keeps its curves.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from spotlight.config.base import ConfigError, Validated, nearest, spec

# Tracker name -> (module it imports, pip package that provides it).
TRACKERS = {"tensorboard": ("tensorboardX", "tensorboardX"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny"), "trackio": ("trackio", "trackio")}
# The trackers' extra, installed from the checkout (the distribution is spotlight-dit).
EXTRA = "pip install -e '.[tracking]' in the Spotlight checkout"
TRACKIO_REMOTE = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")   # trackio's own remote settings


@dataclass(kw_only=True, frozen=True)
class TrackingConfig(Validated):
    """Experiment trackers: each iteration's metrics (flow_grpo's names plus Spotlight's stage
    times, exploration plan, audit τ, preemptions and cost) and every validation grid."""

    backends: list[str] = spec(
        ["tensorboard"], "Trackers the run writes to, any of 'tensorboard', 'wandb', 'mlflow', "
        "'trackio' ([] = none). Each resumes its own run when the Spotlight run is resumed, "
        "so curves continue without duplicate steps.")
    dir: str = spec(
        "", "Folder the trackers write into (TensorBoard event files in tensorboard/, wandb's "
        "offline runs in wandb/, MLflow's file store in mlflow/). Empty: RUN/tracking/ inside "
        "a run on a local file system; for a run in object storage (s3://, memory://) a local "
        "folder of the Spotlight cache (tracking/SCHEME/BUCKET/PATH), and the TensorBoard "
        "event files are copied into the store's tracking/tensorboard/ after every iteration "
        "(`tensorboard --logdir s3://BUCKET/RUN/tracking/tensorboard` reads them where boto3 "
        "is installed). trackio always keeps its own local database ($TRACKIO_DIR, default "
        "~/.cache/huggingface/trackio).", path="optional")
    project: str = spec("spotlight", "Project the run is filed under: the wandb project, the "
                                     "MLflow experiment, the trackio project.")
    run_name: str = spec("", "The run's name in the trackers; empty = the last part of the run "
                             "store's URL (e.g. 20261127-101500-ab12cd34).")
    offline: bool = spec(True, "Keep every tracker local: wandb in offline mode (upload later "
                               "with `wandb sync DIR/wandb/offline-run-*`), MLflow in its local "
                               "file store DIR/mlflow (`mlflow ui --backend-store-uri "
                               "DIR/mlflow`), trackio in its local database (`trackio show`). "
                               "false: wandb logs online, MLflow to $MLFLOW_TRACKING_URI when "
                               "set, trackio to $TRACKIO_SPACE_ID or $TRACKIO_SERVER_URL when "
                               "set.")

    def validate(self) -> None:
        for name in self.backends:
            if name not in TRACKERS:
                raise ConfigError(f"TrackingConfig.backends names '{name}', which is not a "
                                  f"tracker{nearest(name, list(TRACKERS))} (trackers: "
                                  f"{', '.join(TRACKERS)}); the optional ones install with "
                                  f"{EXTRA}")
        repeated = sorted({n for n in self.backends if self.backends.count(n) > 1})
        if repeated:
            raise ConfigError(f"TrackingConfig.backends names {repeated} more than once; list "
                              "each tracker once")
        if not self.project.strip():
            raise ConfigError("TrackingConfig.project is empty; name the project the run is "
                              "filed under, e.g. 'spotlight'")


def check_trackers(tracking: TrackingConfig) -> None:
    """Every tracker ``tracking.backends`` names can run here: its package imports, and an
    offline trackio has no remote destination in its environment (it would send the run
    there). A ConfigError naming the tracker and what to do otherwise; checked before a run
    starts or resumes."""
    for name in tracking.backends:
        module, package = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking.backends names '{name}', but its package '{package}' "
                              f"is not installed; install the trackers with {EXTRA} (or "
                              f"pip install {package}), or remove '{name}' from "
                              "tracking.backends")
    remote = [v for v in TRACKIO_REMOTE if os.environ.get(v)]
    if "trackio" in tracking.backends and tracking.offline and remote:
        raise ConfigError(f"tracking.offline is true, but {remote[0]} is set and trackio would "
                          "send the run there; unset it, or set tracking.offline: false to log "
                          "to it")
