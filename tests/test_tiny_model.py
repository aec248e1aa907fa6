"""The built-in base model: a normal HF directory whose tokenizer survives a reload, and which
writes well-formed answers that are right only part of the time."""

import json
import subprocess
import sys
import zipfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli import tiny
from grpo_cli.data import arithmetic_problems
from grpo_cli.models import load_model, load_tokenizer, resolve_path
from grpo_cli.rewards.exact_match import extract_answer, is_correct
from helpers import generate

TEXTS = ["12+7=19", "a b  c", "<answer>42</answer>", "what is 3*4?"]


def test_autotokenizer_gives_back_the_character_tokenizer_unchanged(tiny_dir):
    built = tiny.build_tokenizer()
    for where in (tiny_dir, resolve_path("builtin:tiny")):
        loaded = AutoTokenizer.from_pretrained(where)
        assert "Qwen" not in type(loaded).__name__ and "Llama" not in type(loaded).__name__
        assert json.loads((where / "tokenizer_config.json").read_text() if hasattr(where, "joinpath")
                          else open(f"{where}/tokenizer_config.json").read())["tokenizer_class"] == "PreTrainedTokenizerFast"
        for text in TEXTS:
            ids = loaded(text)["input_ids"]
            assert ids == built(text)["input_ids"] and len(ids) == len(text)  # one token per character
            assert loaded.decode(ids) == text
        assert (loaded.pad_token, loaded.eos_token, loaded.padding_side) == ("<pad>", "<eos>", "left")


def test_the_builder_writes_a_directory_automodel_loads(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.vocab_size == len(tiny.build_tokenizer())
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_noisy_warmup_targets_are_right_at_the_configured_rate_and_otherwise_near_misses():
    import random

    rng = random.Random(0)
    answers = [int(tiny.noisy_answer(20, 15, rng, p_correct=0.35)) for _ in range(4000)]
    right = sum(a == 35 for a in answers) / len(answers)
    assert abs(right - 0.35) < 0.03
    assert {a - 35 for a in answers} <= {0, *tiny.NEAR_MISSES}


def test_the_shipped_base_model_is_right_only_part_of_the_time_but_well_formed():
    torch.manual_seed(0)
    model, tok = load_model("builtin:tiny", device="cpu"), load_tokenizer("builtin:tiny")
    test = arithmetic_problems()["test"].select(range(100))
    roll = generate(model, tok, test["prompt"], 4, max_new_tokens=6)
    answers = [a for a in test["answer"] for _ in range(4)]
    sampled = sum(is_correct(c, a) for c, a in zip(roll.completions, answers)) / len(answers)
    well_formed = sum(extract_answer(c) == c for c in roll.completions) / len(answers)
    assert 0.15 <= sampled <= 0.5, sampled  # GRPO has room to improve from here
    assert well_formed >= 0.95 and roll.truncated.float().mean() == 0  # a number, then EOS


def test_a_non_editable_wheel_carries_the_config_tree_and_the_base_model(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("grpo_cli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("grpo_cli/conf/train.yaml", "grpo_cli/conf/evaluate.yaml", "grpo_cli/conf/sample.yaml",
                   "grpo_cli/conf/model/tiny.yaml", "grpo_cli/conf/algo/grpo.yaml",
                   "grpo_cli/assets/tiny/model.safetensors", "grpo_cli/assets/tiny/tokenizer.json"):
        assert needed in names, needed
