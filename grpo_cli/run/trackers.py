"""Experiment trackers behind one small interface: each gets every metrics row (the numbers of one
step, or one held-out evaluation) at its step, and is closed at the end. metrics.jsonl is always
written (console.MetricsLog); `trainer.trackers=[tensorboard,wandb,mlflow,trackio]` adds any of:

- tensorboard: event files in the run directory (torch's SummaryWriter; extra `tensorboard`).
- wandb: a Weights & Biases run in the run directory; offline with WANDB_MODE=offline (extra `wandb`).
- mlflow: an MLflow run; the tracking store is MLFLOW_TRACKING_URI, else `mlflow.db` (SQLite) in the
  run directory (`mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db`) (extra `mlflow`).
- trackio: a trackio run, stored locally (TRACKIO_DIR) unless a Space is configured (extra `trackio`).

Each uses the tracker's own client; a tracker that is not installed is refused before any work, with
the extra that provides it. The project is `trainer.tracker_project`, the run name the run directory's.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError


def numbers(row: dict) -> dict[str, float]:
    """The row's numeric values (bools and the step itself left out)."""
    return {
        k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def check_trackers(names: list[str]) -> None:
    """Every named tracker (names checked by the config's declarations) is installed, or one sentence naming the
    extra."""
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(CLASSES[name].module)
        except ImportError:
            raise GrpoError(
                f"trainer.trackers includes {name}, which is not installed; install it with "
                f"pip install 'grpo-cli[{name}]', or drop it from trainer.trackers."
            ) from None


class TensorBoard:
    """Every number of each row as a scalar at the row's step. `purge_step` (a resumed run's first step)
    hides what an earlier process logged from there on."""

    module = "torch.utils.tensorboard"  # its client, imported when the run starts

    def __init__(self, run_dir: Path, config: dict, project: str, resumed_at: int | None):
        from torch.utils.tensorboard import SummaryWriter  # the extra is checked in check_trackers

        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=resumed_at + 1 if resumed_at else None)

    def write(self, row: dict) -> None:
        for key, value in numbers(row).items():
            self.writer.add_scalar(key, value, row["step"])
        self.writer.flush()  # a killed run keeps every row, as metrics.jsonl does

    def close(self) -> None:
        self.writer.close()


class WandB:
    module = "wandb"  # its client, imported when the run starts

    def __init__(self, run_dir: Path, config: dict, project: str, resumed_at: int | None):
        import wandb

        self.run = wandb.init(
            project=project,
            name=Path(run_dir).name,
            dir=str(run_dir),
            config=config,
            resume="allow",
            id=_run_id(run_dir),
        )

    def write(self, row: dict) -> None:
        self.run.log(numbers(row), step=row["step"])

    def close(self) -> None:
        self.run.finish()


class MLflow:
    module = "mlflow"  # its client, imported when the run starts

    def __init__(self, run_dir: Path, config: dict, project: str, resumed_at: int | None):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(
            os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"
        )
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=Path(run_dir).name)
        if not resumed_at:  # parameters are written once: MLflow refuses to change a logged one
            mlflow.log_params({k: str(v)[:500] for k, v in _flat(config).items()})

    def write(self, row: dict) -> None:
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in numbers(row).items()}, step=row["step"])

    def close(self) -> None:
        self.mlflow.end_run()


class Trackio:
    module = "trackio"  # its client, imported when the run starts

    def __init__(self, run_dir: Path, config: dict, project: str, resumed_at: int | None):
        import trackio

        self.trackio = trackio
        trackio.init(project=project, name=Path(run_dir).name, config=config, resume="allow")

    def write(self, row: dict) -> None:
        self.trackio.log(numbers(row), step=row["step"])

    def close(self) -> None:
        self.trackio.finish()


CLASSES: dict[str, Any] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow, "trackio": Trackio}
TRACKERS = tuple(CLASSES)  # trainer.trackers: the config's check, the docs and completion read this one list


def open_trackers(names: list[str], run_dir: Path, config: dict, project: str, resumed_at: int | None = None) -> list:
    return [CLASSES[name](Path(run_dir), config, project, resumed_at) for name in dict.fromkeys(names)]


def _run_id(run_dir: Path) -> str:
    """A stable id per run directory, so a resumed run continues the same tracker run."""
    import hashlib

    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
