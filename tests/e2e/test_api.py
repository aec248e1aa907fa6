"""The Python API: the three commands from a notebook, with reward functions defined there."""

import json

import pytest

from helpers import FAST, read_jsonl


def test_train_evaluate_and_sample_from_python_with_a_notebook_reward(tmp_path):
    import grpo_cli.commands.evaluation  # noqa: F401  (every module loaded first: no submodule shadows a function)
    import grpo_cli.commands.sampling  # noqa: F401
    from grpo_cli import GrpoError, evaluate, sample, train

    assert all(callable(f) and not isinstance(f, type(grpo_cli)) for f in (train, evaluate, sample))

    def brevity(completions, **kwargs):
        return [1.0 / (1 + len(c)) for c in completions]

    run = tmp_path / "run"
    summary = train(
        *FAST, f"output_dir={run}", "trainer.log_completions_every=1", reward_funcs=[brevity], reward_weights=[2.0]
    )
    assert summary["steps"] == 2 and summary["run_dir"] == str(run)
    for s in read_jsonl(run / "completions.jsonl"):  # the notebook's function, weighted, worked by hand
        assert s["reward"] == pytest.approx(2.0 / (1 + len(s["completion"])))
    assert "reward/brevity" in read_jsonl(run / "metrics.jsonl")[0]
    scores = evaluate(
        f"checkpoint={run}/final",
        "samples=0",
        "limit=4",
        f"output_dir={tmp_path / 'ev'}",
        reward_funcs=[brevity],
        reward_weights=[2.0],
    )
    assert scores == json.loads((tmp_path / "ev" / "eval.json").read_text()) and scores["num_prompts"] == 4
    rows = sample(f"checkpoint={run}/final", "prompt='3+4='", "answer=7", reward_funcs=brevity, reward_weights=[2.0])
    assert len(rows) == 4 and all(  # G = 4, as the run was trained (sampler saved with it)
        r["reward"] == pytest.approx(2.0 / (1 + len(r["completion"]))) for r in rows
    )
    with pytest.raises(GrpoError, match="trainer.stepz is not a setting; did you mean trainer.steps"):
        train("trainer.stepz=1")
    with pytest.raises(GrpoError, match="reward_funcs must be a function"):
        train(reward_funcs=["not a function"])


def test_main_returns_the_run_summary():
    from grpo_cli.cli import main

    summary = main(["train", *FAST, "trainer.steps=1", "output_dir=/tmp/grpo_api_main", "overwrite=true"])
    assert summary["steps"] == 1 and summary["run_dir"] == "/tmp/grpo_api_main"


def test_trl_tools_and_an_environment_class_are_taken_as_python_objects(tmp_path):
    """train(..., tools=[fn], environment_factory=Class): TRL's arguments, defined here, not in a file."""
    from grpo_cli import train

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    class Notes:
        made = 0

        def reset(self, **row):
            Notes.made += 1

        def note(self, text: str) -> str:
            """Keep a note.

            Args:
                text: The note.
            """
            return "ok"

    summary = train(
        "experiment=tool_use",
        f"output_dir={tmp_path}",
        "trainer.steps=1",
        "trainer.prompts_per_step=2",
        "sampler.group_size=2",
        "trainer.eval_before_after=false",
        "trainer.eval_every=0",
        "trainer.progress=false",
        tools=[add],
        environment_factory=Notes,
    )
    assert summary["steps"] == 1 and Notes.made == 4  # one environment per episode
    config = (tmp_path / "config.yaml").read_text()
    assert "grpo_cli.notebook_rewards:add" in config and "grpo_cli.notebook_rewards:Notes" in config
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "env/turns" in rows[0]


def test_train_takes_trl_s_train_dataset_and_eval_dataset_objects(tmp_path, monkeypatch):
    """train_dataset= / eval_dataset= as datasets.Dataset objects, as TRL's trainer takes them: the rows
    the run trains on and holds out are theirs (saved once in the cache, by fingerprint, for resume)."""
    from datasets import Dataset

    from grpo_cli import GrpoError, train

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 9) for b in range(1, 9)]
    held = [{"prompt": "5+5=", "answer": "10"}, {"prompt": "6+7=", "answer": "13"}]
    run = tmp_path / "run"
    summary = train(
        *[a for a in FAST if not a.startswith("data.")],
        f"output_dir={run}",
        "trainer.log_completions_every=1",
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(held),
    )
    assert summary["steps"] == 2
    import yaml

    data = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert data["name"] == "files" and data["train_file"].startswith(str(tmp_path / "cache" / "grpo-cli" / "datasets"))
    assert Dataset.from_parquet(data["test_file"]).to_list() == held
    assert {r["prompt"] for r in read_jsonl(run / "completions.jsonl")} <= {r["prompt"] for r in rows}
    with pytest.raises(GrpoError, match="train_dataset must be a datasets.Dataset"):
        train(train_dataset=[{"prompt": "1+1="}])
    with pytest.raises(GrpoError, match="leave out data="):
        train("data=gsm8k", train_dataset=Dataset.from_list(rows))
