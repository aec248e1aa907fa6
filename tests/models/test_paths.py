"""Where a model path points (models/paths.py): a preset's models/... is found from any directory, in the checkout
grpo runs from, and a missing one says where it was looked for and how to build it."""

from grpo_cli.config import model as paths_config
from grpo_cli.config.model import ModelConfig
from grpo_cli.models import paths


def test_a_preset_s_model_is_found_in_the_checkout_from_another_directory(tmp_path, monkeypatch):
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    (checkout / "models" / "Small").mkdir(parents=True)
    (checkout / "models" / "Small" / "config.json").write_text("{}")
    elsewhere.mkdir()
    monkeypatch.setattr(paths_config, "CHECKOUT", checkout)
    monkeypatch.chdir(elsewhere)
    assert ModelConfig(path="models/Small").path == str(checkout / "models" / "Small")
    assert paths.local_problem(ModelConfig(path="models/Small").path, "model.path") is None
    (elsewhere / "models" / "Small").mkdir(parents=True)  # one here wins: the path means what it says where it runs
    assert ModelConfig(path="models/Small").path == "models/Small"
    assert ModelConfig(path="org/name").path == "org/name"  # a hub id stays one


def test_a_preset_s_missing_model_names_both_places_and_make_smollm2(tmp_path, monkeypatch):
    monkeypatch.setattr(paths_config, "CHECKOUT", tmp_path / "checkout")
    monkeypatch.chdir(tmp_path)
    problem = paths.local_problem("models/SmolLM2-135M-Instruct", "model.path")
    assert problem is not None
    assert f"is in neither {tmp_path} nor {tmp_path / 'checkout'}" in problem and "run `make smollm2` there" in problem
