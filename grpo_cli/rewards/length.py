"""reward=length: DAPO's soft overlong punishment, a penalty that grows as a completion nears the limit."""

from __future__ import annotations


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO eq. 13, with L the completion's length in tokens, L_max and L_cache the buffer:
    0 when L <= L_max - L_cache, (L_max - L_cache - L) / L_cache inside the buffer, -1 past L_max."""
    if length <= max_length - buffer:
        return 0.0
    if length <= max_length:
        return (max_length - buffer - length) / buffer
    return -1.0


def build(cfg):
    max_length, buffer = cfg.max_length, cfg.overlong_buffer
    if max_length < 1 or not 0 <= buffer < max_length:  # checks.check_reward refuses these
        raise ValueError(f"max_length={max_length}, overlong_buffer={buffer}: need 0 <= buffer < max_length.")

    def reward(batch):
        assert batch.completion_tokens is not None, "reward=length needs the completions' token counts"
        return [overlong_penalty(n, max_length, buffer) for n in batch.completion_tokens]

    return reward
