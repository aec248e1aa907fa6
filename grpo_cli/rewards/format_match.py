"""reward=format: 1.0 when the whole completion matches a regex, else 0.0 (e.g. a think/answer layout)."""

from __future__ import annotations

import re


def build(cfg):
    """`reward.format_pattern` must match the completion from start to end (surrounding whitespace
    aside); `.` also matches newlines, so `<think>.*?</think>` spans lines."""
    pattern = re.compile(cfg.format_pattern, re.DOTALL)  # checks.check_reward has compiled it once
    return lambda batch: [float(pattern.fullmatch(c.strip()) is not None) for c in batch.completions]
