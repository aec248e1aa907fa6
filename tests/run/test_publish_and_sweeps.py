"""Sweeps whatever runs the jobs (joblib workers, submitit processes, Optuna trials): the summary table
comes from files each job writes. The model card in final/, and pushing final/ to the hub."""

import csv
import importlib.util
import json
import os

import pytest

from grpo_cli.cli import main
from helpers import FAST
from helpers import grpo_process as grpo_cli

FAST = [*FAST, "trainer.log_completions_every=0"]


def has(plugin: str) -> bool:
    try:  # a dotted name raises, not returns None, when its parent package (hydra_plugins) is missing
        return importlib.util.find_spec(plugin) is not None
    except ModuleNotFoundError:
        return False


def sweep_rows(sweep_dir):
    with open(sweep_dir / "sweep.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.skipif(
    not has("hydra_plugins.hydra_joblib_launcher"),
    reason="hydra-joblib-launcher is not installed (pip install 'grpo-cli[sweeps]')",
)
def test_a_joblib_sweep_keeps_its_table_csv_and_the_failed_job_s_exit_code(tmp_path):
    (tmp_path / "good.py").write_text(
        "def score(completions, **kw):\n    return [float(len(c) % 2) for c in completions]\n"
    )
    out = grpo_cli(
        "train",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        *FAST,
        "reward=python",
        "reward.fn=good:score,missing_module:score",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    rows = sweep_rows(tmp_path / "sweep")
    assert [(r["job"], r["status"]) for r in rows] == [("0", "done"), ("1", "failed")]
    assert "missing_module" in rows[1]["error"] and float(rows[0]["reward_last20"]) >= 0
    assert "sweep jobs 1 failed" in out.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not has("hydra_plugins.hydra_submitit_launcher"),
    reason="hydra-submitit-launcher is not installed (pip install 'grpo-cli[sweeps]')",
)
def test_a_submitit_sweep_lists_every_job(tmp_path):
    out = grpo_cli(
        "train",
        "-m",
        "hydra/launcher=submitit_local",
        *FAST,
        "trainer.seed=0,1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = sweep_rows(tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["done", "done"] and rows[0]["overrides"] != rows[1]["overrides"]


@pytest.mark.slow
@pytest.mark.skipif(
    not has("hydra_plugins.hydra_optuna_sweeper"),
    reason="hydra-optuna-sweeper is not installed (pip install 'grpo-cli[sweeps]')",
)
def test_optuna_optimises_the_objective_the_config_names(tmp_path):
    import yaml

    out = grpo_cli(
        "train",
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize",
        "objective=reward_last20",
        "optimizer.lr=interval(1e-4,1e-3)",
        *FAST,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    rows = sweep_rows(tmp_path / "sweep")
    assert len(rows) == 2 and best["best_value"] == max(float(r["reward_last20"]) for r in rows)


def test_objective_must_be_a_summary_number_that_the_run_measures(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}", *FAST, "objective=greedy_accuracy_after"])
    assert e.value.code == 2 and "trainer.eval_before_after=true" in capsys.readouterr().err


def test_final_has_a_model_card_with_the_base_model_settings_metrics_and_command(tiny_dir, tmp_path):
    from huggingface_hub import ModelCard

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(
            [
                "train",
                f"model.path={tiny_dir}",
                f"output_dir={run}",
                *FAST[:3],
                "trainer.progress=false",
                "data.max_operand=9",
                "data.num_test=20",
                "trainer.eval_prompts=10",
                "model.name=tiny-copy",
            ]
        )
        raise SystemExit(0)
    assert e.value.code in (0, None)
    card = ModelCard.load(run / "final" / "README.md")
    assert "grpo" in card.data.tags and card.data.library_name == "transformers"
    assert card.data.base_model is None  # a local directory is not a hub id
    overrides = (run / "overrides.yaml").read_text()
    assert "grpo train " in card.text and f"model.path={tiny_dir}" in card.text and "model.path" in overrides
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward_mean" in r]
    assert f"| mean reward, first step | {rows[0]['reward_mean']:.3f} |" in card.text
    assert "held-out greedy accuracy after" in card.text and "`algo=grpo`" in card.text


def test_hub_push_is_refused_up_front_when_the_hub_cannot_be_reached(tmp_path, monkeypatch, capsys):
    import grpo_cli.models.hub as hub

    monkeypatch.setattr(hub, "_HUB_STATE", "hub.invalid: Name or service not known")
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}", *FAST, "hub.push=true", "hub.repo_id=me/model"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "hub.push=true but the Hugging Face hub cannot be reached" in err
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing trained
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}", *FAST, "hub.push=true"])
    assert e.value.code == 2 and "needs hub.repo_id" in capsys.readouterr().err


def test_hub_push_uploads_final_with_its_card(tmp_path, monkeypatch):
    import huggingface_hub

    import grpo_cli.models.hub as hub

    calls = []

    class FakeApi:  # the hub itself is out of reach here; what grpo-cli asks of it is what is checked
        def create_repo(self, repo_id, **kw):
            calls.append(("create", repo_id, kw))

        def upload_folder(self, repo_id, folder_path, **kw):
            files = sorted(os.listdir(folder_path))
            calls.append(("upload", repo_id, folder_path, files))
            return type("Info", (), {"commit_url": f"https://hub/{repo_id}/commit/1"})()

    monkeypatch.setattr(hub, "_HUB_STATE", "")  # reachable
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}", *FAST, "hub.push=true", "hub.repo_id=me/model"])
        raise SystemExit(0)
    assert e.value.code in (0, None)
    assert calls[0] == ("create", "me/model", {"private": True, "exist_ok": True})
    kind, repo, folder, files = calls[1]
    assert folder == str(tmp_path / "final") and "README.md" in files and "model.safetensors" in files
    assert "config.yaml" in files
