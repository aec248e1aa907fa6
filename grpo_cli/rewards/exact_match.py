"""Exact match of the answer extracted from a completion against the dataset's answer."""

from __future__ import annotations

import re

from grpo_cli.errors import GrpoError

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str, extract: str = "last_number", pattern: re.Pattern | None = None) -> str | None:
    """The answer part of a completion, or None when it has none."""
    if extract == "last_number":
        found = NUMBER.findall(text)
        return found[-1] if found else None
    if extract == "hash":
        return text.split("####")[-1] if "####" in text else None
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
    raise GrpoError(f"Unknown reward.extract={extract!r}; choose last_number, hash, boxed, regex or full.")


def normalise(answer: str) -> str:
    """Whitespace, thousands separators and a trailing '.0' do not make an answer wrong."""
    s = answer.strip().replace(",", "").rstrip(".")
    try:
        value = float(s)
    except ValueError:
        return " ".join(s.split())
    return str(int(value)) if value.is_integer() else repr(value)


def is_correct(completion: str, answer: str, extract: str = "last_number", pattern: re.Pattern | None = None) -> bool:
    got = extract_answer(completion, extract, pattern)
    return got is not None and normalise(got) == normalise(str(answer))


def build(cfg):
    """reward=exact_match: 1.0 when the extracted answer equals the dataset's answer, else 0.0."""
    fn = exact_match_reward(cfg.extract, cfg.pattern)
    return lambda batch: fn(batch.prompts, batch.completions, batch.answers)


def compile_pattern(extract: str = "last_number", pattern: str | None = None) -> re.Pattern | None:
    """reward.pattern compiled for extract=regex (None otherwise); an unknown mode is refused now, not mid-run."""
    if extract == "regex":
        if not pattern:
            raise GrpoError("reward.extract=regex needs reward.pattern, a regex with one capture group.")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise GrpoError(f"reward.pattern {pattern!r} does not compile ({e}); fix the regex.") from None
    else:
        compiled = None
    extract_answer("", extract)
    return compiled


def answer_extractor(extract: str = "last_number", pattern: str | None = None):
    """fn(completion) -> its answer as exact_match reads it (extracted, normalised), or None."""
    compiled = compile_pattern(extract, pattern)

    def answer(completion: str) -> str | None:
        got = extract_answer(completion, extract, compiled)
        return None if got is None else normalise(got)

    return answer


def exact_match_reward(extract: str = "last_number", pattern: str | None = None):
    compiled = compile_pattern(extract, pattern)

    def reward(prompts, completions, answers):
        return [float(is_correct(c, a, extract, compiled)) for c, a in zip(completions, answers)]

    return reward
