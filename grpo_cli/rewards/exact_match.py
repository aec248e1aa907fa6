"""Exact match of the answer extracted from a completion against the dataset's answer."""

from __future__ import annotations

import re
from functools import lru_cache

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str, extract: str = "last_number", pattern: re.Pattern | None = None) -> str | None:
    """The answer part of a completion, or None when it has none."""
    if extract == "last_number":
        found = NUMBER.findall(text)
        return found[-1] if found else None
    if extract == "hash":  # the first line after the last ####: a model may run on past its answer
        if "####" not in text:
            return None
        return next((line for line in text.split("####")[-1].splitlines() if line.strip()), "")
    if extract == "boxed":
        start = text.rfind("\\boxed{")
        if start < 0:
            return None
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j]
        return None
    if extract == "regex":
        m = pattern.search(text) if pattern else None
        return m.group(1) if m else None
    if extract == "full":
        return text
    raise ValueError(f"unknown extraction {extract!r} (checks.check_reward lists them).")


def normalise(answer: str) -> str:
    """Whitespace, thousands separators and a trailing '.0' do not make an answer wrong."""
    s = answer.strip().replace(",", "").rstrip(".")
    try:
        return str(int(s))  # exact: through float, integers above 2**53 would collide
    except ValueError:
        pass
    try:
        value = float(s)
    except ValueError:
        return " ".join(s.split())
    return str(int(value)) if value.is_integer() else repr(value)


def matches(got: str, target: str, extract: str) -> bool:
    """Whether an extracted answer equals the normalised target; after ####, the first number of the
    line counts too, so `#### 72 apples` is right for 72 (GSM8K-style) and `#### yes` still for yes."""
    if normalise(got) == target:
        return True
    number = NUMBER.search(got) if extract == "hash" else None
    return number is not None and normalise(number.group()) == target


def is_correct(completion: str, answer: str, extract: str = "last_number", pattern: re.Pattern | None = None) -> bool:
    got = extract_answer(completion, extract, pattern)
    return got is not None and matches(got, normalise(str(answer)), extract)


def build(cfg):
    """reward=exact_match: 1.0 when the extracted answer equals the dataset's answer, else 0.0."""
    fn = exact_match_reward(cfg.extract, cfg.pattern)
    return lambda batch: fn(batch.prompts, batch.completions, batch.answers)


def compile_pattern(extract: str = "last_number", pattern: str | None = None) -> re.Pattern | None:
    """reward.pattern compiled for extract=regex (None otherwise); checks.check_reward has checked both."""
    if extract == "regex":
        compiled = re.compile(pattern or "")
        if compiled.groups < 1:
            raise ValueError(f"reward.pattern {pattern!r} has no capture group (checks.check_reward refuses it).")
    else:
        compiled = None
    extract_answer("", extract)
    return compiled


@lru_cache(maxsize=16)
def answer_extractor(extract: str = "last_number", pattern: str | None = None):
    """fn(completion, target) -> its answer as exact_match reads it (extracted, normalised; the
    normalised target itself whenever exact_match scores it right, so votes agree), or None."""
    compiled = compile_pattern(extract, pattern)

    def answer(completion: str, target: str) -> str | None:
        got = extract_answer(completion, extract, compiled)
        if got is None:
            return None
        return target if matches(got, target, extract) else normalise(got)

    return answer


@lru_cache(maxsize=16)  # built once per (extract, pattern), not at every step or evaluation
def exact_match_reward(extract: str = "last_number", pattern: str | None = None):
    compiled = compile_pattern(extract, pattern)

    def reward(prompts, completions, answers):
        return [float(is_correct(c, a, extract, compiled)) for c, a in zip(completions, answers)]

    return reward
