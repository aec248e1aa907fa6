"""Experiment trackers, each in its offline or local mode, through the real CLI: every metrics row of
metrics.jsonl reaches the tracker at its step (checked by reading the tracker's own store back)."""

import importlib.util
import uuid

import pytest

from helpers import SMALL, SMALL_DATA, grpo, metric_rows

THREE_STEPS = ["trainer.steps=3", *SMALL, *SMALL_DATA, "trainer.log_completions_every=0"]


def needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed (pip install 'grpo-cli[{module}]')"
    )


def train(run, *extra):
    assert grpo("train", f"output_dir={run}", *THREE_STEPS, *extra) == 0
    return metric_rows(run, training=True)


@needs("wandb")
def test_wandb_offline_gets_every_row(tmp_path, monkeypatch):
    """A real offline wandb run (its history goes to a .wandb file for `wandb sync`, which only the
    wandb service reads back): every row reaches the run's own log() at its step."""
    from grpo_cli.run import trackers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged, runs = [], []
    init = trackers.WandB.__init__

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append(self.run)
        log = self.run.log
        self.run.log = lambda values, step: (logged.append((step, values)), log(values, step=step))[1]

    monkeypatch.setattr(trackers.WandB, "__init__", spy_init)
    rows = train(tmp_path / "run", "trainer.trackers=[wandb]", "trainer.tracker_project=p")
    (run,) = runs
    assert run.offline and run.project == "p" and run.name == "run"
    assert [(step, values["reward_mean"]) for step, values in logged] == [(r["step"], r["reward_mean"]) for r in rows]
    assert set(logged[0][1]) == {
        k for k, v in rows[0].items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    (offline,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))[0].stat().st_size > 0


@needs("mlflow")
def test_mlflow_local_store_gets_every_row_at_its_step(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = train(tmp_path / "run", "trainer.trackers=[mlflow]", "trainer.tracker_project=p")
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (r["step"], pytest.approx(r["reward_mean"])) for r in rows
    ]
    assert run.data.params["optimizer.lr"] == "0.0003"


@needs("trackio")
def test_trackio_local_gets_every_row(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    # trackio reads TRACKIO_DIR when first imported: once another test has imported it, rows go to its
    # default directory, which outlives the test; a project of its own keeps earlier runs' rows out
    project = f"p-{uuid.uuid4().hex[:8]}"
    rows = train(tmp_path / "run", "trainer.trackers=[trackio]", f"trainer.tracker_project={project}")
    import trackio.sqlite_storage as storage

    logged = storage.SQLiteStorage.get_logs(project, "run")
    values = [(m["step"], m["reward_mean"]) for m in logged if "reward_mean" in m]
    assert values == [(r["step"], pytest.approx(r["reward_mean"])) for r in rows]


def test_an_unknown_tracker_is_refused_at_composition(tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path}", *THREE_STEPS, "trainer.trackers=[neptune]") == 2
    assert "trainer.trackers='neptune' must be one of tensorboard, wandb, mlflow, trackio" in capsys.readouterr().err
