"""The tracker back-ends: TensorBoard (tensorboardX), Weights & Biases, MLflow, trackio.

Each takes the same three calls -- scalars at a step, a validation grid at a step, flush --
and knows how to reopen its own run, so a resumed Spotlight run continues the same curves:
TensorBoard appends a new event file to the same folder, wandb resumes its run id, MLflow
reopens its run id, trackio resumes its run by name. Every one works offline by default.

Their packages are imported when a tracker opens: wandb, MLflow and trackio are optional
(the ``[tracking]`` extra), and none of them should slow down ``import pipelines``.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from pipelines.observe.validation_grid import ValidationGrid

Upload = Callable[[str, bytes], None]   # (file name, contents) -> copied into the run store


@dataclass(frozen=True)
class Place:
    """Where and under which names a run's trackers write."""

    folder: Path        # the trackers' local files (tensorboard/, wandb/, mlflow/)
    project: str
    run_name: str
    offline: bool
    params: dict        # the run's config, flattened (logged once, when a tracker's run starts)


class Tracker(Protocol):
    name: str
    identity: str | None   # what reopens its run (wandb id, MLflow run id); None: the folder

    def log_scalars(self, step: int, values: dict[str, float]) -> None: ...

    def log_grid(self, step: int, grid: ValidationGrid, scalars: dict[str, float]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def caption(label: str, reward: float) -> str:
    """flow_grpo's caption of a validation image: the prompt, then its score."""
    return f"{label:.100} | reward: {reward:.3f}"


def grid_table(grid: ValidationGrid) -> str:
    """The grid's prompts and scores as a Markdown table (image i is the i-th in the grid)."""
    rows = [f"| {i} | {label.replace('|', '/')} | {reward:.4f} |"
            for i, (label, reward) in enumerate(zip(grid.labels, grid.rewards.tolist()))]
    return "\n".join([f"weights version {grid.version}, mean reward {grid.mean_reward:.4f}", "",
                      "| image | prompt | reward |", "|---|---|---|", *rows])


def montage(images: np.ndarray, columns: int = 8) -> np.ndarray:
    """uint8 (N, H, W, 3) -> one (rows*H, columns*W, 3) picture, row by row."""
    n, h, w, c = images.shape
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    canvas = np.zeros((rows * h, columns * w, c), dtype=np.uint8)
    for i, image in enumerate(images):
        r, col = divmod(i, columns)
        canvas[r * h:(r + 1) * h, col * w:(col + 1) * w] = image
    return canvas


class TensorBoardTracker:
    """Event files in ``FOLDER/tensorboard``: scalars, the grid as one image and its table.
    Each opening writes a new event file (a unique suffix), so a resumed run appends.
    ``upload``: the event files are also copied into the run store at every flush."""

    name = "tensorboard"

    def __init__(self, place: Place, identity: str | None, upload: Upload | None = None):
        from tensorboardX import SummaryWriter  # why: imported when a run tracks, not on import

        self.logdir = place.folder / "tensorboard"
        self.logdir.mkdir(parents=True, exist_ok=True)
        before = set(os.listdir(self.logdir))
        self.writer = SummaryWriter(str(self.logdir), flush_secs=3600,
                                    filename_suffix=f".{uuid.uuid4().hex[:8]}")
        self.files = sorted(set(os.listdir(self.logdir)) - before)   # this writer's
        self.upload = upload
        self.identity = "tensorboard"
        if identity is None:   # a new run: its config, once
            self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in
                                                     sorted(place.params.items())), 0)

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def log_grid(self, step: int, grid: ValidationGrid, scalars: dict[str, float]) -> None:
        self.log_scalars(step, scalars)
        self.writer.add_images("eval_images", grid.images, step, dataformats="NHWC")
        self.writer.add_text("eval_images/prompts", grid_table(grid), step)

    def flush(self) -> None:
        self.writer.flush()
        if self.upload is not None:
            for name in self.files:
                self.upload(name, (self.logdir / name).read_bytes())

    def close(self) -> None:
        self.writer.close()
        if self.upload is not None:
            for name in self.files:
                self.upload(name, (self.logdir / name).read_bytes())


class WandbTracker:
    """A wandb run in ``FOLDER/wandb`` (offline: ``wandb sync`` uploads it later), resumed by
    its id; the grid as captioned images (flow_grpo's ``eval_images``)."""

    name = "wandb"

    def __init__(self, place: Place, identity: str | None):
        import wandb  # why: optional (the [tracking] extra)

        self.wandb = wandb
        self.identity = identity or uuid.uuid4().hex[:12]
        place.folder.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                  disable_git=True, save_code=False)
        self.run = wandb.init(project=place.project, name=place.run_name, id=self.identity,
                              dir=str(place.folder), resume="allow",
                              mode="offline" if place.offline else "online",
                              config=place.params if identity is None else None,
                              settings=settings, reinit="create_new")

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_grid(self, step: int, grid: ValidationGrid, scalars: dict[str, float]) -> None:
        images = [self.wandb.Image(image, caption=caption(label, reward))
                  for image, label, reward in zip(grid.images, grid.labels,
                                                  grid.rewards.tolist())]
        self.run.log({**scalars, "eval_images": images}, step=step)

    def flush(self) -> None:
        pass   # wandb writes its run file as it goes

    def close(self) -> None:
        self.run.finish()


class MLflowTracker:
    """An MLflow run, offline in the file store ``FOLDER/mlflow``, reopened by its run id;
    the grid as an image and a JSON table of prompts and scores per step (artifacts)."""

    name = "mlflow"

    def __init__(self, place: Place, identity: str | None):
        uri = (place.folder / "mlflow").resolve().as_uri()
        if not place.offline:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or uri
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked for it: the one that needs no
            # database or server (mlflow-skinny has neither).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param  # why: optional (the [tracking] extra)
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        self.identity = identity if identity and self._exists(identity) else None
        if self.identity is None:
            experiment = self.client.get_experiment_by_name(place.project)
            experiment_id = experiment.experiment_id if experiment is not None else \
                self.client.create_experiment(place.project)
            run = self.client.create_run(experiment_id, run_name=place.run_name)
            self.identity = run.info.run_id
            params = [Param(k, str(v)[:500]) for k, v in sorted(place.params.items())]
            for i in range(0, len(params), 100):   # MLflow takes 100 params per batch
                self.client.log_batch(self.identity, params=params[i:i + 100])
        else:
            self.client.update_run(self.identity, status="RUNNING")

    def _exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except Exception:   # noqa: BLE001 - not in this store (resumed on another machine)
            return False
        return True

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(k, float(v), now, step) for k, v in values.items()]
        self.client.log_batch(self.identity, metrics=metrics)

    def log_grid(self, step: int, grid: ValidationGrid, scalars: dict[str, float]) -> None:
        self.log_scalars(step, scalars)
        self.client.log_image(self.identity, montage(grid.images),
                              artifact_file=f"eval_images/step-{step:06d}.png")
        self.client.log_dict(self.identity, {"version": grid.version, "labels": grid.labels,
                                             "rewards": grid.rewards.tolist(),
                                             "mean_reward": grid.mean_reward},
                             f"eval_images/step-{step:06d}.json")

    def flush(self) -> None:
        pass   # every call above is written when it returns

    def close(self) -> None:
        self.client.set_terminated(self.identity)


class TrackioTracker:
    """A trackio run in trackio's local database (``trackio show``), resumed by name; the
    grid as a table of (prompt, image, score)."""

    name = "trackio"

    def __init__(self, place: Place, identity: str | None):
        import trackio  # why: optional (the [tracking] extra)

        self.trackio = trackio
        self.identity = identity or place.run_name
        self.run = trackio.init(project=place.project, name=self.identity, resume="allow",
                                config=place.params if identity is None else None,
                                embed=False, auto_log_gpu=False, auto_log_cpu=False)

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_grid(self, step: int, grid: ValidationGrid, scalars: dict[str, float]) -> None:
        rows = [[label, self.trackio.Image(image, caption=caption(label, reward)), reward]
                for image, label, reward in zip(grid.images, grid.labels,
                                                grid.rewards.tolist())]
        table = self.trackio.Table(columns=["prompt", "image", "score"], data=rows)
        self.run.log({**scalars, "eval_images": table}, step=step)

    def flush(self) -> None:
        pass   # trackio writes its database in the background; finish() drains it

    def close(self) -> None:
        self.run.finish()


def open_tracker(name: str, place: Place, identity: str | None,
                 upload: Upload | None = None) -> Tracker:
    """Open (or reopen, given its ``identity``) the named tracker's run."""
    if name == "tensorboard":
        return TensorBoardTracker(place, identity, upload)
    return {"wandb": WandbTracker, "mlflow": MLflowTracker,
            "trackio": TrackioTracker}[name](place, identity)
