"""Users' own rewards and data through the real `grpo` entry point: everything loaded is built here,
in temp dirs (local files, a reward model, a reward module); every bad input is one sentence, exit 2."""

import json
import re
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from grpo_cli.config import RewardConfig, register_configs
from grpo_cli.data.tasks import PromptBatch
from grpo_cli.errors import GrpoError
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.rewards import Judge, build_reward
from grpo_cli.rollout import source
from grpo_cli.samples.settings import StepSettings
from helpers import SMALL, grpo, grpo_process, read_jsonl
from tiny_models import tiny

OWN_DATA = ["trainer.steps=2", *SMALL, "trainer.save_every=1000"]  # the data is the test's own files
# Lowercase only: the built-in tiny tokenizer has no capitals.
ROWS = [{"question": f"what is {a} plus {b}?", "answer": a + b, "level": a % 3} for a in range(6) for b in range(4)]


def train(tmp_path, capsys, *overrides):
    out = tmp_path / "run"
    code = grpo("train", f"output_dir={out}", *OWN_DATA, *overrides, hydra_dir=tmp_path / "hydra")
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    return read_jsonl(out / "metrics.jsonl")


def fails(tmp_path, capsys, *args):
    """Runs `grpo`, expects exit 2 without a trace and without a metrics row or checkpoint; returns the message."""
    code = grpo(*args, hydra_dir=tmp_path / "hydra")
    printed = capsys.readouterr()
    text = " ".join((printed.out + printed.err).split())
    assert code == 2, text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()
    return text


def write(path, rows=ROWS):
    frame = pd.DataFrame(rows)
    {
        ".jsonl": lambda: frame.to_json(path, orient="records", lines=True),
        ".csv": lambda: frame.to_csv(path, index=False),
        ".parquet": lambda: frame.to_parquet(path),
    }[path.suffix]()
    return path


def files(path, *more):
    return ["data=files", f"data.train_file={path}", "data.prompt_field=question", *more]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """Writes a reward module under a fresh name on sys.path and returns `reward.fn=` for it."""
    made = []

    def make(body: str) -> str:
        name = f"user_rewards_{len(made)}_{abs(hash(str(tmp_path))) % 10**8}"
        (tmp_path / f"{name}.py").write_text(body)
        made.append(name)
        return f"reward.fn={name}:score"

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in made:
        sys.modules.pop(name, None)


def build_reward_model(out, seed=0, num_labels=1):
    """A tiny random Qwen2 sequence classifier with the built-in character tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tok = tiny.build_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=128,
            num_labels=num_labels,
            pad_token_id=tok.pad_token_id,
        )
    )
    return tiny.save(model, tok, out)


def test_reward_model_scores_prompt_plus_completion_in_batches(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    path = build_reward_model(tmp_path / "rm")
    fn = build_reward(RewardConfig(name="model", model_path=str(path), model_batch_size=2, model_device="cpu"))
    prompts, completions = ["1+2=", "1+2=", "10+20=", "3+4="], ["3", "4", "30", "7"]
    values = fn(prompts, completions, ["3", "3", "30", "7"])
    tok = tiny.build_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        alone = [float(model(**tok(p + c, return_tensors="pt")).logits[0, 0]) for p, c in zip(prompts, completions)]
    assert values == pytest.approx(alone, abs=1e-5)  # padding in a batch changes nothing
    assert len(set(values)) > 1


def test_a_classifier_with_two_labels_is_refused(tmp_path):
    path = build_reward_model(tmp_path / "rm", num_labels=2)
    with pytest.raises(GrpoError, match="has 2 labels"):
        build_reward(RewardConfig(name="model", model_path=str(path), model_device="cpu"))


def test_a_reward_model_scores_only_as_many_tokens_as_its_tokenizer_allows(tmp_path):
    """A prompt + completion longer than the tokenizer's model_max_length is truncated, not run past
    the model's positions (a crash inside the model)."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    tok = tiny.build_tokenizer()
    tok.model_max_length = 16
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(
        GPT2Config(
            vocab_size=len(tok),
            n_positions=16,
            n_embd=32,
            n_layer=1,
            n_head=2,
            num_labels=1,
            pad_token_id=tok.pad_token_id,
        )
    )
    path = tiny.save(model, tok, tmp_path / "rm")
    fn = build_reward(RewardConfig(name="model", model_path=str(path), model_device="cpu"))
    prompt = "1+2=" * 10  # 40 tokens
    values = fn([prompt, "3+4="], ["3", "7"], ["3", "7"])
    with torch.no_grad():
        first16 = float(model.eval()(**tok(prompt[:16], return_tensors="pt")).logits[0, 0])
    assert values[0] == pytest.approx(first16, abs=1e-5)


def test_a_device_torch_does_not_know_is_one_sentence_naming_its_option(tmp_path):
    import torch

    from grpo_cli.models.loading import resolve_device

    with pytest.raises(GrpoError, match="model.device=gpu is not a device torch knows; use model.device=auto"):
        resolve_device("gpu")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        GrpoError, match="^reward.model_device=gpu is not a device torch knows; use reward.model_device="
    ):
        build_reward(RewardConfig(name="model", model_path=str(tmp_path), model_device="gpu"))
    if not torch.cuda.is_available():
        with pytest.raises(
            GrpoError, match="^reward.model_device=cuda but no CUDA device is visible; use reward.model_device=cpu"
        ):
            build_reward(RewardConfig(name="model", model_path=str(tmp_path), model_device="cuda"))


# --- the happy paths -----------------------------------------------------------------------------


def test_train_on_jsonl_train_and_test_files_with_a_prompt_template(tmp_path, capsys):
    train_file, test_file = write(tmp_path / "train.jsonl", ROWS[:20]), write(tmp_path / "test.jsonl", ROWS[20:])
    rows = train(
        tmp_path, capsys, *files(train_file, f"data.test_file={test_file}", "data.template='q: {question} a:'")
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/exact_match"] == r["reward_mean"] for r in rows)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_train_on_one_local_file_split_by_a_test_fraction(tmp_path, capsys, suffix):
    rows = train(tmp_path, capsys, *files(write(tmp_path / f"rows{suffix}"), "data.test_size=0.25"))
    assert len(rows) == 2 and all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)


def test_train_on_the_harder_built_in_task(tmp_path, capsys):
    rows = train(tmp_path, capsys, "data=long_addition", "data.digits=2", "data.num_train=200", "data.num_test=20")
    assert len(rows) == 2


def test_train_with_a_reward_model_built_here(tmp_path, capsys):
    model_dir = build_reward_model(tmp_path / "reward_model")
    rows = train(
        tmp_path,
        capsys,
        "data.max_operand=9",
        "data.num_test=20",
        "reward=model",
        f"reward.model_path={model_dir}",
        "reward.model_device=cpu",
        "reward.model_batch_size=5",
    )
    for r in rows:
        assert r["reward/model"] == pytest.approx(r["reward_mean"]) and r["reward_std"] > 0  # a score per text


def test_train_with_a_python_reward_sees_the_calling_convention(tmp_path, capsys, reward_module, monkeypatch):
    fn = reward_module(
        "import json, os\n"
        "def score(prompts, completions, answers, completion_tokens, **columns):\n"
        "    with open(os.environ['CALLS_LOG'], 'a') as f:\n"
        "        f.write(json.dumps(dict(prompts=prompts, completions=completions, answers=answers,\n"
        "                                completion_tokens=completion_tokens, columns=sorted(columns))) + '\\n')\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answers)]\n"
    )
    monkeypatch.setenv("CALLS_LOG", str(tmp_path / "calls.jsonl"))
    rows = train(tmp_path, capsys, *files(write(tmp_path / "rows.jsonl"), "data.test_size=4"), "reward=python", fn)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and len(rows) == 2
    for call in calls:
        assert all(len(call[k]) == 16 for k in ("prompts", "completions", "answers", "completion_tokens"))
        assert call["prompts"][0:4] == [call["prompts"][0]] * 4  # a prompt's G completions are adjacent
        assert all(1 <= n <= 6 for n in call["completion_tokens"])  # sampler.max_new_tokens=6
        assert all(isinstance(a, str) for a in call["answers"])


def test_evaluate_passes_every_dataset_column_to_a_python_reward(tmp_path, capsys, reward_module):
    fn = reward_module(
        "def score(prompts, completions, answers, completion_tokens, question, answer, level):\n"
        "    assert answer == answers and len(level) == len(completions)\n"
        "    return [float(x) for x in level]\n"
    )
    data = files(write(tmp_path / "rows.jsonl"), f"data.test_file={write(tmp_path / 'test.jsonl', ROWS[:6])}")
    code = grpo("evaluate", *data, "reward=python", fn, f"output_dir={tmp_path / 'eval'}", hydra_dir=tmp_path / "hydra")
    assert code == 0, capsys.readouterr()
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())["rows"][0]
    assert result["reward_mean"] == pytest.approx(sum(r["level"] for r in ROWS[:6]) / 6)


def test_combo_logs_each_term_and_trains_on_the_weighted_sum(tmp_path, capsys):
    rows = train(
        tmp_path,
        capsys,
        "data.max_operand=9",
        "data.num_test=20",
        "reward=combo",
        "reward.terms=[exact_match,length]",
        "reward.weights=[1.0,0.5]",
        "reward.max_length=3",
        "reward.overlong_buffer=2",
    )
    for r in rows:
        assert r["reward_mean"] == pytest.approx(r["reward/exact_match"] + 0.5 * r["reward/length"])
        assert -1.0 <= r["reward/length"] <= 0.0


def test_collect_gives_rewards_columns_per_completion_and_keeps_the_terms_of_kept_groups(reward_module):
    from grpo_cli.config import TrainConfig
    from grpo_cli.models.loading import load_model, load_tokenizer

    spec = reward_module(
        "def score(completions, level, **kw):\n    return [float(x * (i % 2)) for i, x in enumerate(level)]\n"
    )
    reward = build_reward(
        RewardConfig(
            name="combo",
            terms=["python", "length"],
            weights=[2.0, 1.0],
            fn=spec.split("=", 1)[1],
            max_length=100,
            overlong_buffer=10,
        )
    )
    cfg = TrainConfig()
    cfg.sampler.group_size, cfg.algo.dynamic_sampling, cfg.algo.max_refill_rounds = 4, True, 2
    policy, tok = load_model("builtin:tiny", device="cpu"), load_tokenizer("builtin:tiny")
    refills = {1: PromptBatch(["3+3=", "4+4="], ["6", "8"], [2, 3], {"level": [0, 1]})}  # level 0: flat, dropped
    roll, answers, _ = source.collect(
        HFGenerator(tok),
        policy,
        PromptBatch(["1+1=", "2+2="], ["2", "4"], [0, 1], {"level": [1, 0]}),
        reward,
        StepSettings.of(cfg, Judge(cfg.reward, reward)),
        refill=refills.get,
    )
    assert roll.prompts == ["1+1=", "4+4="] and answers == ["2", "8"]
    assert roll.extra["reward_terms"]["python"].tolist() == [[0.0, 1.0, 0.0, 1.0]] * 2
    assert roll.extra["reward_terms"]["length"].tolist() == [[0.0] * 4] * 2
    assert roll.rewards.tolist() == [[0.0, 2.0, 0.0, 2.0]] * 2


# --- bad input: one sentence, exit 2, nothing half-written ---------------------------------------


def test_a_missing_column_names_the_columns_that_exist(tmp_path, capsys):
    text = fails(
        tmp_path,
        capsys,
        "train",
        f"output_dir={tmp_path / 'run'}",
        *OWN_DATA,
        *files(write(tmp_path / "rows.jsonl"), "data.answer_field=solution"),
    )
    assert (
        "Column 'solution' is missing from the 'train' split of data=files; it has ['question', 'answer', 'level']"
        in text
    )


def test_data_without_an_answer_column_trains_with_a_reward_that_reads_none(
    tmp_path, capsys, reward_module, monkeypatch
):
    """TRL's contract: no column is required beyond what the rewards read. Rows with only a question train
    with a TRL-style reward, which is handed the columns that exist (no `answer`); a reward that compares
    with the answer (the default exact_match) is one sentence naming the column, before any step."""
    fn = reward_module(
        "import json, os\n"
        "def score(completions, **kwargs):\n"
        "    with open(os.environ['CALLS_LOG'], 'a') as f:\n"
        "        f.write(json.dumps(sorted(kwargs)) + '\\n')\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.setenv("CALLS_LOG", str(tmp_path / "calls.jsonl"))
    questions = write(tmp_path / "rows.jsonl", [{"question": r["question"], "level": r["level"]} for r in ROWS])
    rows = train(tmp_path, capsys, *files(questions, "data.test_size=4"), "reward=python", fn)
    assert len(rows) == 2 and all("reward/python" in r for r in rows)
    kwargs = {tuple(json.loads(line)) for line in (tmp_path / "calls.jsonl").read_text().splitlines()}
    assert kwargs and all("answer" not in k and "answers" in k and "question" in k and "level" in k for k in kwargs)

    text = fails(
        tmp_path / "again", capsys, "train", f"output_dir={tmp_path / 'again' / 'run'}", *OWN_DATA, *files(questions)
    )
    assert (
        "Column 'answer' is missing from data=files (it has ['question', 'level']), and exact_match compares "
        "with it; set data.answer_field"
    ) in text


def test_an_empty_split_is_named(tmp_path, capsys):
    (tmp_path / "test.csv").write_text("question,answer\n")
    text = fails(
        tmp_path,
        capsys,
        "train",
        f"output_dir={tmp_path / 'run'}",
        *OWN_DATA,
        *files(write(tmp_path / "rows.jsonl"), f"data.test_file={tmp_path / 'test.csv'}"),
    )
    assert "error: data.test_file=" in text and "has no rows; give it some." in text


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "def score(completions, **kw):\n    return [1 / 0 for c in completions]\n",
            r"Reward 'python' raised ZeroDivisionError: division by zero on completion 0 \(",
        ),
        (
            "def score(completions, **kw):\n    return [float('nan')] * len(completions)\n",
            r"Reward 'python' returned nan for completion 0 \(.*\); rewards must be finite floats",
        ),
        (
            "def score(completions, **kw):\n    return [1.0]\n",
            r"Reward 'python' returned 1 values for 16 completions; it must return one float per completion",
        ),
    ],
)
def test_a_python_reward_that_misbehaves_stops_the_run_with_one_sentence(
    tmp_path, capsys, reward_module, body, message
):
    text = fails(
        tmp_path,
        capsys,
        "train",
        f"output_dir={tmp_path / 'run'}",
        *OWN_DATA,
        "data.max_operand=9",
        "data.num_test=20",
        "reward=python",
        reward_module(body),
    )
    assert re.search(message, text), text


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["reward=model", "reward.model_path=/nonexistent/reward_model"],
            "reward.model_path=/nonexistent/reward_model does not exist",
        ),
        (["reward=format", "reward.format_pattern='(unclosed'"], "reward.format_pattern '(unclosed' does not compile"),
        (["reward.extract=regex", "reward.pattern='(unclosed'"], "reward.pattern '(unclosed' does not compile"),
        (
            ["reward=python", "reward.fn=no_such_module_xyz:score"],
            "reward.fn='no_such_module_xyz:score' cannot be imported (ModuleNotFoundError: No module named "
            "'no_such_module_xyz')",
        ),
        (
            ["reward=combo", "reward.terms=[exact_match,format]", "reward.weights=[1.0]"],
            "reward.weights has 1 values for the 2 reward terms",
        ),
    ],
)
def test_a_bad_reward_option_is_one_sentence_before_any_work(tmp_path, capsys, overrides, message):
    text = fails(tmp_path, capsys, "train", f"output_dir={tmp_path / 'run'}", *OWN_DATA, *overrides)
    assert message in text


def test_an_unreachable_hub_dataset_is_one_sentence(tmp_path):
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = grpo_process(
        "train",
        f"output_dir={tmp_path / 'run'}",
        *OWN_DATA,
        "data=hub",
        "data.hub_name=grpo-cli-tests/no-such-dataset",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        env=env,
    )
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2, text
    assert "Could not load the dataset grpo-cli-tests/no-such-dataset" in text and "hub" in text
    assert "Traceback" not in text and not (tmp_path / "run" / "metrics.jsonl").exists()


# --- the config groups -----------------------------------------------------------------------------


def group_options(group):
    from importlib.resources import files as package_files

    return sorted(p.name[:-5] for p in (package_files("grpo_cli.conf") / group).iterdir() if p.name.endswith(".yaml"))


def test_the_reward_and_data_groups_offer_every_option():
    assert group_options("reward") == [
        "auto",
        "code",
        "combo",
        "exact_match",
        "format",
        "length",
        "math",
        "model",
        "none",
        "python",
        "reasoning_gym",
    ]
    assert group_options("data") == [
        "arithmetic",
        "code",
        "files",
        "gsm8k",
        "hub",
        "links",
        "long_addition",
        "none",
        "reasoning_gym",
    ]


@pytest.mark.parametrize("group", ["reward", "data"])
def test_every_option_file_composes_against_the_schema_and_comments_every_key(group):
    from importlib.resources import files as package_files

    register_configs()
    with initialize_config_module(config_module="grpo_cli.conf", version_base="1.3"):
        for option in group_options(group):
            cfg = compose(config_name="train", overrides=[f"{group}={option}"])
            assert OmegaConf.select(cfg, f"{group}.name") is not None, option
            text = (package_files("grpo_cli.conf") / group / f"{option}.yaml").read_text()
            for line in text.splitlines():
                if line.strip() and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
                    assert " # " in line, f"{group}/{option}.yaml: {line!r} has no comment"


def test_the_gsm8k_preset_reads_the_answer_after_hashes_on_both_sides():
    register_configs()
    with initialize_config_module(config_module="grpo_cli.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["data=gsm8k"])
    assert (cfg.data.name, cfg.data.hub_name, cfg.data.hub_config) == ("hub", "openai/gsm8k", "main")
    assert cfg.data.answer_extract == "hash" and cfg.reward.extract == "hash"
