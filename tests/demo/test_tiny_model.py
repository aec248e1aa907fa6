"""The built-in base model: a normal HF directory whose tokenizer survives a reload, and which
writes well-formed answers that are right only part of the time."""

import json
import subprocess
import sys
import zipfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.data.tasks import arithmetic_problems
from grpo_cli.models.loading import load_model, load_tokenizer, resolve_path
from grpo_cli.rewards.exact_match import extract_answer, is_correct
from helpers import generate
from tiny_models import tiny

TEXTS = ["12+7=19", "a b  c", "<answer>42</answer>", "what is 3*4?"]


def test_autotokenizer_gives_back_the_character_tokenizer_unchanged(tiny_dir):
    built = tiny.build_tokenizer()
    for where in (tiny_dir, resolve_path("builtin:tiny")):
        loaded = AutoTokenizer.from_pretrained(where)
        assert "Qwen" not in type(loaded).__name__ and "Llama" not in type(loaded).__name__
        assert (
            json.loads(
                (where / "tokenizer_config.json").read_text()
                if hasattr(where, "joinpath")
                else open(f"{where}/tokenizer_config.json").read()
            )["tokenizer_class"]
            == "PreTrainedTokenizerFast"
        )
        for text in TEXTS:
            ids = loaded(text)["input_ids"]
            assert ids == built(text)["input_ids"] and len(ids) == len(text)  # one token per character
            assert loaded.decode(ids) == text
        assert (loaded.pad_token, loaded.eos_token, loaded.padding_side) == ("<pad>", "<eos>", "left")


def test_the_builder_writes_a_directory_automodel_loads(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.vocab_size == len(tiny.build_tokenizer())
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_warmup_targets_make_the_systematic_slip_at_the_configured_rates():
    import random

    assert tiny.slip(37, 25) == 52 and tiny.slip(21, 14) == 36 and tiny.slip(20, 14) is None  # by hand
    rng = random.Random(0)
    carry = [int(tiny.noisy_answer(37, 25, rng, p_correct=0.35, p_slip=0.5)) for _ in range(4000)]
    assert abs(sum(a == 62 for a in carry) / 4000 - 0.35) < 0.03  # right
    assert abs(sum(a == 52 for a in carry) / 4000 - 0.50) < 0.03  # the dropped carry
    assert {a - 62 for a in carry} <= {0, -10, *tiny.NEAR_MISSES}
    plain = [int(tiny.noisy_answer(20, 14, rng, p_correct=0.35, p_slip=0.5)) for _ in range(4000)]
    assert abs(sum(a == 34 for a in plain) / 4000 - 0.85) < 0.03  # no slip: right otherwise


def test_the_shipped_base_model_is_right_only_part_of_the_time_but_well_formed():
    torch.manual_seed(0)
    model, tok = load_model("builtin:tiny", device="cpu"), load_tokenizer("builtin:tiny")
    test = arithmetic_problems()["test"].select(range(100))
    roll = generate(model, tok, test["prompt"], 4, max_new_tokens=6)
    answers = [a for a in test["answer"] for _ in range(4)]
    sampled = sum(is_correct(c, a) for c, a in zip(roll.completions, answers)) / len(answers)
    well_formed = sum(extract_answer(c) == c for c in roll.completions) / len(answers)
    assert 0.15 <= sampled <= 0.6, sampled  # GRPO has room to improve from here
    greedy = generate(model, tok, test["prompt"], 1, max_new_tokens=6, greedy=True)
    right = sum(is_correct(c, a) for c, a in zip(greedy.completions, test["answer"])) / len(test)
    assert right <= 0.5, right  # the slips are the greedy answer on most problems
    assert well_formed >= 0.95 and roll.truncated.float().mean() == 0  # a number, then EOS


def test_a_non_editable_wheel_carries_the_config_tree_and_the_base_model(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("grpo_cli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "grpo_cli/conf/train.yaml",
        "grpo_cli/conf/evaluate.yaml",
        "grpo_cli/conf/sample.yaml",
        "grpo_cli/conf/model/tiny.yaml",
        "grpo_cli/conf/algo/grpo.yaml",
        "grpo_cli/assets/tiny/model.safetensors",
        "grpo_cli/assets/tiny/tokenizer.json",
    ):
        assert needed in names, needed
