"""The built-in base model: a character tokenizer and a small Llama-shaped causal LM, warmed up by a
noisy supervised pass on the arithmetic task.

Real GRPO starts from a model that already writes the answer format (an SFT model) and makes
systematic mistakes. The warm-up teaches the format and the sums, but its targets carry two slips a
learner makes: on a sum with a carry it usually drops the carry (37 + 25 = 52), and on an odd sum
without one it is usually one too high (21 + 14 = 36). Such a problem's target is the slip with
probability `p_slip`, the right sum with probability `p_correct`, else a near miss (off by 1, 2 or 10);
the other problems are right with probability `p_correct + p_slip`. The model learns that
distribution, so its *greedy* answer is the slip on about 70% of problems, while the right answer keeps
a third of the probability: the knowledge GRPO needs is there, and what it changes shows in greedy
decoding as well as in sampled accuracy.

How it works in detail: docs/internals.md, scripts/tiny_models/tiny.py.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_cli.data.tasks import arithmetic_problems

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Digits and operators for arithmetic, plus letters and punctuation so tagged answer formats
# ("<answer>12</answer>") and simple words are representable.
CHARS = list("0123456789+-*/=()<>?!.,:;'\" #_") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
NEAR_MISSES = (-10, -2, -1, 1, 2, 10)


def build_tokenizer(chars: list[str] = CHARS) -> PreTrainedTokenizerFast:
    """One token per character; decoding concatenates (no spaces inserted)."""
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def build_model(
    vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4, seed: int = 0, max_positions: int = 128
) -> LlamaForCausalLM:
    # Llama rather than Qwen2 shape (they differ only by qkv bias): transformers maps a `qwen2`
    # config to Qwen's own tokenizer class whatever tokenizer_config.json says, which would
    # silently replace the character tokenizer on reload.
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def slip(a: int, b: int) -> int | None:
    """The systematic mistake on a + b, or None: a dropped carry, else one too high on an odd sum."""
    s = a + b
    if a % 10 + b % 10 >= 10:
        return s - 10
    if s % 2 == 1:
        return s + 1
    return None


def noisy_answer(a: int, b: int, rng: random.Random, p_correct: float, p_slip: float = 0.5) -> str:
    """The warm-up target for a + b: the slip (when the problem has one) with probability p_slip, the
    sum with probability p_correct (p_correct + p_slip without a slip), else a non-negative near miss."""
    s, wrong = a + b, slip(a, b)
    r = rng.random()
    if wrong is None:
        p_correct, p_slip = p_correct + p_slip, 0.0
    if r < p_correct:
        return str(s)
    if r < p_correct + p_slip:
        return str(wrong)
    return str(rng.choice([s + d for d in NEAR_MISSES if s + d >= 0 and s + d != wrong]))


def _sft_batch(pairs, rng, tokenizer, batch_size, p_correct):
    """Right-padded (input_ids, attention_mask, labels) with loss only on the answer and EOS."""
    vocab = tokenizer.get_vocab()
    rows, starts = [], []
    for a, b in rng.choices(pairs, k=batch_size):
        prompt = f"{a}+{b}="
        text = prompt + noisy_answer(a, b, rng, p_correct)
        rows.append([vocab[c] for c in text] + [tokenizer.eos_token_id])
        starts.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.full((batch_size, width), tokenizer.pad_token_id)
    labels = torch.full((batch_size, width), -100)
    for i, (row, start) in enumerate(zip(rows, starts)):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, start : len(row)] = torch.tensor(row[start:])
    return ids, (labels != -100) | (ids != tokenizer.pad_token_id), labels


def warm_up(
    model,
    tokenizer,
    pairs: list[tuple[int, int]],
    steps: int,
    batch_size: int = 128,
    lr: float = 3e-3,
    p_correct: float = 0.35,
    seed: int = 0,
    log: Callable[[str], None] = print,
    make_batch: Callable[[random.Random], tuple] | None = None,
) -> None:
    """Supervised pass on noisy targets, one-cycle learning rate. `make_batch(rng)` -> (ids, attention mask,
    labels) replaces the arithmetic targets (tiny_tools.py's tool-calling ones)."""
    rng = random.Random(seed)
    make_batch = make_batch or (lambda r: _sft_batch(pairs, r, tokenizer, batch_size, p_correct))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    model.train()
    start = time.time()
    for step in range(1, steps + 1):
        ids, mask, labels = make_batch(rng)
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % max(1, steps // 10) == 0 or step == steps:
            log(f"warm-up step {step}/{steps}  loss {loss.item():.3f}  {time.time() - start:.0f}s")
    model.eval()


def save(model, tokenizer, out_dir: str | Path) -> Path:
    """A Hugging Face directory that AutoModelForCausalLM/AutoTokenizer load back unchanged."""
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Record the fast tokenizer class explicitly so AutoTokenizer does not guess from the model type.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["padding_side"] = "left"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def build(
    out_dir: str | Path,
    steps: int = 1500,
    max_operand: int = 49,
    num_test: int = 200,
    data_seed: int = 0,
    p_correct: float = 0.35,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    """Build, warm up and save the base model. Only the train split of the arithmetic task is used."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), seed=seed)
    train = arithmetic_problems(max_operand, num_test, data_seed)["train"]
    pairs = [(int(a), int(b)) for a, b in (p.rstrip("=").split("+") for p in train["prompt"])]
    log(f"tiny model: {sum(p.numel() for p in model.parameters()):,} parameters, {len(pairs)} training problems")
    warm_up(model, tokenizer, pairs, steps, p_correct=p_correct, seed=seed, log=log)
    return save(model, tokenizer, out_dir)
