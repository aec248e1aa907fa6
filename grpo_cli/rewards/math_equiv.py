"""reward=math: 1.0 when the completion's answer is symbolically equal to the dataset's, via math-verify.

`math-verify` (an optional extra: `pip install 'grpo-cli[math]'`) extracts the last LaTeX or plain
expression of each text (a \\boxed{...} first) and compares them with sympy, so `\\frac{1}{2}`, `0.5`
and `1/2` are the same answer. Its per-answer timeouts use SIGALRM, which only the main thread may
set, so elsewhere it runs without them.
"""

from __future__ import annotations

import threading

from grpo_cli.errors import GrpoError

TIMEOUT_S = 5  # per parse and per comparison: sympy can take forever on adversarial text


def build(cfg):
    try:
        from math_verify import parse, verify
    except ImportError:
        raise GrpoError(
            "reward=math needs the math-verify library; install it with pip install 'grpo-cli[math]'."
        ) from None

    def reward(batch):
        timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
        golds = {}  # a prompt's G completions share one reference: parse it once
        values = []
        for completion, answer in zip(batch.completions, batch.answers):
            if answer not in golds:
                golds[answer] = parse(answer, parsing_timeout=timeout)
            gold = golds[answer]
            got = parse(completion, parsing_timeout=timeout)
            values.append(float(bool(gold) and verify(gold, got, timeout_seconds=timeout)))
        return values

    return reward
