"""The slow lane (`make test-real`): a real pretrained instruct model, SmolLM2-135M-Instruct built offline
by `make smollm2`, trained, evaluated and sampled through the real CLI."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import grpo_process

pytestmark = pytest.mark.real
MODEL = Path(os.environ.get("GRPO_SMOLLM2", "models/SmolLM2-135M-Instruct"))
SHORT = [
    "experiment=smollm2_arithmetic",
    f"model.path={MODEL}",
    "trainer.steps=2",
    "trainer.prompts_per_step=4",
    "sampler.group_size=4",
    "sampler.max_new_tokens=12",
    "trainer.eval_before_after=false",
    "trainer.log_completions_every=1",
]


@pytest.fixture(scope="module", autouse=True)
def needs_model():
    if not (MODEL / "model.safetensors").exists():
        pytest.skip(f"{MODEL} is missing: build it with `make smollm2` (scripts/build_smollm2.py)")


def grpo(*args):
    return grpo_process(*args, timeout=900, check_rc=0)


def test_a_real_instruct_model_trains_in_the_precision_auto_picks_and_its_completions_end_at_im_end(tmp_path):
    out = grpo("train", *SHORT, f"output_dir={tmp_path}")
    # the preset's precision=auto: bf16-mixed where bf16 is native, fp32 elsewhere, said before the first step
    said = [line for line in out.stderr.splitlines() if line.startswith("precision: ")]
    assert len(said) == 1 and said[0].split()[1] in ("fp32", "bf16-mixed"), out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["skipped"] == 0.0 for r in rows)
    before, after = load_file(MODEL / "model.safetensors"), load_file(tmp_path / "final" / "model.safetensors")
    changed = sum(int((before[k] != after[k]).sum()) for k in before) / sum(v.numel() for v in before.values())
    assert changed > 0.9, changed  # fp32 master weights: a 3e-6 step registers almost everywhere
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in after.values())
    completions = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert completions and all("<|im_end|>" not in c["completion"] for c in completions)  # EOS is not text


def test_chat_prompts_encode_to_apply_chat_template_s_ids_with_the_real_tokenizer():
    from transformers import AutoTokenizer

    from grpo_cli.generate.hf import HFGenerator

    tok = AutoTokenizer.from_pretrained(MODEL)
    messages = [
        {"role": "system", "content": "Reply with only the number."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert HFGenerator(tok, chat_template=True).encode([rendered]) == [list(want)]


def test_evaluate_scores_the_real_model_on_held_out_sums(tmp_path):
    grpo(
        "evaluate",
        "model=instruct",
        f"model.path={MODEL}",
        "data.max_operand=9",
        "data.num_test=50",
        "data.template='What is {a} + {b}?'",
        "data.chat_template=true",
        "data.system_prompt='Reply with only the number.'",
        "sampler.max_new_tokens=12",
        "limit=8",
        "samples=2",
        "k=[1,2]",
        "precision=bf16",
        f"output_dir={tmp_path}",
    )
    row = json.loads((tmp_path / "eval.json").read_text())["rows"][0]
    assert row["num_prompts"] == 8 and 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0


def test_the_preset_s_first_step_starts_right_after_the_model_loads_and_the_start_is_scored_at_the_end(tmp_path):
    """The preset measures the held-out scores before training after its last step (trainer.eval_before_at=end),
    so nothing is scored between the model loading and step 1; the summary still has both ends."""
    args = [a for a in SHORT if not a.startswith(("trainer.eval_before_after", "trainer.steps"))]
    out = grpo("train", *args, "trainer.steps=1", "trainer.eval_prompts=8", f"output_dir={tmp_path}")
    lines = out.stderr.splitlines() + out.stdout.splitlines()
    loaded = next(i for i, line in enumerate(lines) if "loaded the model" in line)
    step = next(i for i, line in enumerate(lines) if "step 1: sampling" in line)
    between = lines[loaded + 1 : step]
    assert len(between) == 1 and "measured after the last step" in between[0], lines[loaded : step + 1]
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert sorted(r["step"] for r in evals) == [0, 1]
    print(f"model loaded -> step 1: {lines[loaded].split()[0]} -> {lines[step].split()[0]}")  # elapsed, as printed
