"""reward=format: 1.0 when the whole completion matches a regex, else 0.0 (e.g. a think/answer layout)."""

from __future__ import annotations

import re

from grpo_cli.errors import GrpoError


def build(cfg):
    """`reward.format_pattern` must match the completion from start to end (surrounding whitespace
    aside); `.` also matches newlines, so `<think>.*?</think>` spans lines."""
    try:
        pattern = re.compile(cfg.format_pattern, re.DOTALL)
    except re.error as e:
        raise GrpoError(f"reward.format_pattern {cfg.format_pattern!r} does not compile ({e}); fix the regex.") from None
    return lambda batch: [float(pattern.fullmatch(c.strip()) is not None) for c in batch.completions]
