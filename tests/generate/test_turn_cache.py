"""Keys and values kept between an episode's turns (grpo_cli/generate/turn_cache.py): a second turn started
from the first turn's kept rows samples what re-prefilling the whole context samples, running only the
environment's tokens through the model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.data.prompts import encode_prompts
from grpo_cli.generate.hf import HFGenerator

PROMPTS = ["3+4=", "12+30=", "7+7=", "50+25=", "3+4=", "1+1="]
ENV_TEXT = ["2+3=", "10+5=", "4+4=", "19=", "6+1=", "8+18="]  # what each episode's environment adds


def _model(tiny_dir, kind: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), attn_implementation="sdpa").eval(), kind


def _two_turns(model, tok, kind: str, session: bool, sampling: SamplerConfig):
    """Both turns' outputs, the second turn's contexts, the forwards' batch widths in the second turn and
    the session's counts."""
    gen = HFGenerator(tok, SimpleNamespace(decode=kind))
    first = encode_prompts(tok, PROMPTS, False)
    env_ids = tok(ENV_TEXT, add_special_tokens=False)["input_ids"]
    seeds = list(range(21, 21 + len(first)))
    with gen.session() if session else _nothing():
        one = gen.complete(model, first, sampling, seeds, with_logprobs=True)
        second = [c + ids + env for c, (ids, _, _), env in zip(first, one, env_ids)]
        widths = []
        hook = model.register_forward_pre_hook(
            lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
        )
        try:
            two = gen.complete(model, second, sampling, [s + 100 for s in seeds], with_logprobs=True)
        finally:
            hook.remove()
        counts = (list(gen.turns.reused), list(gen.turns.computed)) if session else None
    return one, two, second, widths, counts


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kind", ["eager", "static"])
@pytest.mark.parametrize(
    "sampling",
    [SamplerConfig(max_new_tokens=10, temperature=1.3), SamplerConfig(max_new_tokens=7, temperature=0)],
    ids=["sampled", "greedy"],
)
def test_a_turn_from_kept_keys_samples_what_a_whole_prefill_samples(tiny_model, tiny_dir, kind, sampling):
    _, tok = tiny_model
    model, _ = _model(tiny_dir, kind)
    one, two, second, widths, _ = _two_turns(model, tok, kind, False, sampling)
    one_s, two_s, second_s, widths_s, (reused, computed) = _two_turns(model, tok, kind, True, sampling)
    assert [o[0] for o in one] == [o[0] for o in one_s] and second == second_s
    assert [o[0] for o in two] == [o[0] for o in two_s]  # the same tokens
    for (_, lp, end), (_, lp_s, end_s) in zip(two, two_s):
        assert end == end_s
        torch.testing.assert_close(torch.tensor(lp_s), torch.tensor(lp), atol=1e-5, rtol=1e-5)
    assert max(len(ids) for ids, _, _ in two) > 1  # the comparison runs past the first token
    assert sampling.greedy or len({tuple(ids) for ids, _, _ in two}) > 2  # and over varied continuations
    # Each row reuses its first context and its sampled tokens but the last (whose keys exist only when the
    # batch ran on after it: keeping it would make the counts depend on the other rows).
    envs = tok(ENV_TEXT, add_special_tokens=False)["input_ids"]
    for c, (ids, _, _), env, r, n, ctx in zip(encode_prompts(tok, PROMPTS, False), one, envs, reused, computed, second):
        assert r == len(c) + len(ids) - 1 and r + n == len(ctx) and n == len(env) + 1
    # The second turn's prefill ran only the new tokens: as wide as the longest, not the whole context.
    assert widths_s[0] == max(computed) < widths[0] == max(len(ctx) for ctx in second)


def test_a_context_that_does_not_extend_the_last_turn_is_prefilled_whole(tiny_model, tiny_dir):
    """A context whose start differs from every kept row's tokens (re-rendered, or edited) reuses nothing:
    its count says so, and it samples what a whole prefill samples."""
    _, tok = tiny_model
    model, _ = _model(tiny_dir, "eager")
    gen = HFGenerator(tok, SimpleNamespace(decode="eager"))
    sampling = SamplerConfig(max_new_tokens=6, temperature=1.2)
    first = encode_prompts(tok, PROMPTS[:2], False)
    with gen.session():
        one = gen.complete(model, first, sampling, [1, 2])
        second = [first[0] + one[0][0] + [5], [7] + first[1] + one[1][0]]  # the second row's start changed
        two = gen.complete(model, second, sampling, [3, 4])
        reused = list(gen.turns.reused)
    assert reused[0] >= len(first[0]) + len(one[0][0]) - 1 and reused[1] == 0
    assert gen.turns is None  # the session ended with the block
    assert two == gen.complete(model, second, sampling, [3, 4])


def test_prefill_counts_come_from_the_session_s_last_lookup_once():
    """count_prefill: tokens reused and breaks only from a lookup this turn ran; a generator that ignores the
    session (a scripted one) counts none, never a break; a group's shared first context is counted once."""
    from grpo_cli.generate.turn_cache import TurnCache, count_prefill

    eps = [SimpleNamespace(kv_reused=0, prefix_breaks=0, context_tokens=0) for _ in range(3)]
    turns = TurnCache()
    count_prefill(eps, [[1, 2, 3]] * 3, turns, turn=0)  # the first turn of one group: one prefill of 3
    assert [e.context_tokens for e in eps] == [3, 0, 0] and not any(e.prefix_breaks for e in eps)
    count_prefill(eps, [[1, 2, 3, 4], [1, 2, 5], [9]], turns, turn=1)  # no lookup ran: nothing reused, no break
    assert [e.context_tokens for e in eps] == [7, 3, 1] and not any(e.prefix_breaks for e in eps)
    turns.store([1, 2], [3], [])
    turns.lookup([[1, 2, 3, 4], [1, 2, 5], [9, 9]])
    count_prefill(eps, [[1, 2, 3, 4], [1, 2, 5], [9, 9]], turns, turn=1)
    assert [e.kv_reused for e in eps] == [3, 0, 0] and [e.prefix_breaks for e in eps] == [0, 1, 1]
    assert [e.context_tokens for e in eps] == [8, 6, 3]


def test_identical_contexts_run_once_and_sample_what_whole_prefills_sample(tiny_model, tiny_dir):
    """A group's samples that made the same call and got the same reply have identical next contexts: the
    turn runs each distinct one once (as the counts say) and copies its rows, and every row samples, with
    its own seed, what a whole prefill of its context samples."""
    _, tok = tiny_model
    model, _ = _model(tiny_dir, "eager")
    gen = HFGenerator(tok, SimpleNamespace(decode="eager"))
    first = encode_prompts(tok, ["3+4=", "3+4=", "7+7=", "3+4="], False)
    env = tok("2+3=", add_special_tokens=False)["input_ids"]
    greedy, sampled = SamplerConfig(max_new_tokens=6, temperature=0), SamplerConfig(max_new_tokens=8, temperature=1.3)
    seeds = [5, 6, 7, 8]

    def second_turn(session: bool):
        with gen.session() if session else _nothing():
            one = gen.complete(model, first, greedy, seeds)  # the "3+4=" rows decode alike
            second = [c + ids + env for c, (ids, _, _) in zip(first, one)]
            rows = []
            hook = model.register_forward_pre_hook(
                lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
            )
            try:
                two = gen.complete(model, second, sampled, [s + 100 for s in seeds], with_logprobs=True)
            finally:
                hook.remove()
        return second, two, rows

    second, two, rows = second_turn(session=False)
    second_s, two_s, rows_s = second_turn(session=True)
    assert second == second_s and second[0] == second[1] == second[3] != second[2]
    assert rows[0] == 2 and rows_s[0] == 2  # the prefill: the two distinct contexts, not four rows
    assert [ids for ids, _, _ in two] == [ids for ids, _, _ in two_s]
    assert len({tuple(ids) for ids, _, _ in (two[0], two[1], two[3])}) > 1  # the twins' own seeds still tell them apart
    for (_, lp, _), (_, lp_s, _) in zip(two, two_s):
        torch.testing.assert_close(torch.tensor(lp_s), torch.tensor(lp), atol=1e-5, rtol=1e-5)


def test_distinct_rows_names_each_row_s_first_twin():
    from grpo_cli.generate.steps import distinct_rows

    assert distinct_rows([[1, 2], [3], [1, 2], [], [3], [1]]) == ([0, 1, 3, 5], [0, 1, 0, 2, 1, 3])
    assert distinct_rows([[4], [5]]) == ([0, 1], [0, 1]) and distinct_rows([]) == ([], [])


def test_row_kv_takes_a_row_s_held_positions_in_order_with_or_without_holes():
    """A row's kept keys are its attended slots, the first n of them: a left-padded row's are one run (taken as
    a slice), a resumed row's have a hole at the seam (taken by index). Worked by hand on numbered slots."""
    from grpo_cli.generate.turn_cache import row_kv

    slots = torch.arange(2 * 1 * 6 * 1, dtype=torch.float32).view(2, 1, 6, 1)  # [rows, heads, slots, dim]
    layer = SimpleNamespace(keys=slots, values=-slots)
    plain = torch.tensor([0, 0, 1, 1, 1, 1], dtype=torch.bool)  # two pads, then four tokens
    holed = torch.tensor([0, 1, 1, 0, 1, 1], dtype=torch.bool)  # kept keys, a hole, new tokens
    ((k, v),) = row_kv([layer], plain, 1, 3)
    assert k.flatten().tolist() == [8.0, 9.0, 10.0] and v.flatten().tolist() == [-8.0, -9.0, -10.0]
    k[0, 0, 0] = 99.0  # a copy: the decode buffers it came from are written again
    assert slots[1, 0, 2, 0] == 8.0
    ((k, _),) = row_kv([layer], holed, 0, 4)
    assert k.flatten().tolist() == [1.0, 2.0, 4.0, 5.0]
