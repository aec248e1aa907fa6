import functools

import pytest
import torch

from grpo_cli.generate.hf import completion_mask
from helpers import generate, grid, padded, rollout_from_padded, token_logprobs


def test_completion_mask_keeps_tokens_up_to_and_including_the_first_eos():
    eos = 1
    ids = torch.tensor([[5, 6, 1, 0, 0], [5, 1, 7, 1, 0], [5, 6, 7, 8, 9], [1, 0, 0, 0, 0]])
    mask, truncated = completion_mask(ids, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, False, True, False]


def test_completion_mask_accepts_several_eos_ids():
    mask, truncated = completion_mask(torch.tensor([[4, 9, 2, 2], [4, 4, 4, 4]]), [2, 9])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, True]


def _full_vocab_logprobs(model, input_ids, attention_mask, T, temperature):
    """Independent reference: float64 log-softmax over the whole vocabulary of the plain forward."""
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits.double()
    logp = torch.log_softmax(logits[:, -T - 1 : -1] / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, -T:, None]).squeeze(-1)


def test_chunked_token_logprobs_equal_a_full_vocabulary_log_softmax(tiny_model):
    model, tok = tiny_model
    torch.manual_seed(0)
    roll = generate(model, tok, ["3+4=", "12+30=", "7+7="], 3, max_new_tokens=4, temperature=1.3)
    T = roll.completion_len
    for temperature in (1.0, 1.3):
        ids, attention, completion = padded(roll)
        got, ent = token_logprobs(model, ids, attention, T, temperature=temperature, chunk_tokens=5, with_entropy=True)
        want = _full_vocab_logprobs(model, ids, attention, T, temperature)
        m = completion.bool()
        assert torch.allclose(got[m].double(), want[m], atol=1e-5)
        assert (ent[m] >= 0).all()


def test_scored_logprobs_match_the_distribution_generate_sampled_from(tiny_model):
    """Left padding must not shift positions: the loss scores tokens exactly as generate saw them."""
    model, tok = tiny_model
    enc = tok(["3+4=", "12+30="], return_tensors="pt", padding=True)
    out = model.generate(
        **enc,
        do_sample=True,
        top_k=0,
        max_new_tokens=3,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=[tok.eos_token_id],
    )
    seq = out.sequences
    P = enc["input_ids"].shape[1]
    gen_logp = torch.stack([torch.log_softmax(s.double(), -1) for s in out.scores], 1)  # [B, T, V]
    want = gen_logp.gather(-1, seq[:, P:, None]).squeeze(-1)
    mask, _ = completion_mask(seq[:, P:], [tok.eos_token_id])
    attn = torch.cat([enc["attention_mask"], mask], 1)
    got, _ = token_logprobs(model, seq, attn, seq.shape[1] - P)
    assert torch.allclose(got[mask.bool()].double(), want[mask.bool()], atol=1e-5)


def test_generate_returns_group_size_completions_per_prompt_with_padding_masked(tiny_model):
    model, tok = tiny_model
    roll = generate(model, tok, ["1+1=", "40+40="], 4, max_new_tokens=5)
    ids, attention, completion = padded(roll)
    assert ids.shape[0] == roll.rows == 8 and len(roll.completions) == 8
    assert completion.shape == (8, roll.completion_len)
    after = completion == 0
    assert (ids[:, -roll.completion_len :][after] == tok.pad_token_id).all()
    assert (attention[:, -roll.completion_len :] == completion).all()
    assert roll.loss_mask.sum() == roll.completion_lengths.sum()  # every token after a prompt is the model's


def test_the_sampler_s_log_probs_are_the_trainer_s_for_the_same_tokens(tiny_model):
    """The decoder samples exactly softmax(logits / temperature): what the loss's ratios assume."""
    model, tok = tiny_model
    roll = generate(
        model,
        tok,
        ["3+4=", "12+30=", "7+7="],
        4,
        max_new_tokens=5,
        temperature=1.3,
        seeds=[0, 1, 2],
        with_logprobs=True,
    )
    ids, attention, completion = padded(roll)
    got, _ = token_logprobs(model, ids, attention, roll.completion_len, temperature=1.3)
    m = completion.bool()
    assert torch.allclose(grid(roll, roll.sampler_logp)[m], got[m], atol=1e-5)


def test_a_group_s_completions_depend_on_its_seed_not_on_the_rest_of_the_batch(tiny_model):
    """So one process and N ranks (each sampling part of the batch) draw the same completions."""
    model, tok = tiny_model
    together = generate(model, tok, ["3+4=", "12+30=", "7+7=", "1+1="], 5, max_new_tokens=5, seeds=[10, 11, 12, 13])
    alone = generate(model, tok, ["7+7="], 5, max_new_tokens=5, seeds=[12])
    other = generate(model, tok, ["41+41=", "7+7="], 5, max_new_tokens=5, seeds=[99, 12])
    assert together.completions[10:15] == alone.completions == other.completions[5:10]
    reseeded = generate(model, tok, ["7+7="], 5, max_new_tokens=5, seeds=[13])
    assert reseeded.completions != alone.completions  # and the seed does matter


def test_each_distinct_prompt_is_prefilled_once_for_its_whole_group(tiny_model, monkeypatch):
    model, tok = tiny_model
    widths = []
    real = type(model).forward

    @functools.wraps(real)  # the forward's signature kept: generation passes the cache by the name it takes
    def spy(self, *args, **kwargs):
        widths.append(tuple(kwargs["input_ids"].shape))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    generate(model, tok, ["3+4=", "12+30="], 8, max_new_tokens=3, seeds=[0, 1])
    assert widths[0] == (2, 6)  # the prefill: 2 prompts of up to 6 tokens, not 16 copies
    assert all(w[1] == 1 for w in widths[1:])  # then one token per row at a time


def test_greedy_decoding_equals_transformers_generate(tiny_model):
    model, tok = tiny_model
    prompts = ["3+4=", "12+30=", "7+7=", "49+49="]
    ours = generate(model, tok, prompts, max_new_tokens=6, greedy=True)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    theirs = model.generate(
        **enc, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    assert ours.completions == tok.batch_decode(theirs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def test_top_k_and_top_p_keep_the_expected_tokens():
    from grpo_cli.generate.sampling import _filter

    scores = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda s: (s > float("-inf")).int().tolist()  # noqa: E731
    assert kept(_filter(scores, 2, 1.0)) == [[1, 1, 0, 0, 0]]
    assert kept(_filter(scores, 0, 0.7)) == [[1, 1, 0, 0, 0]]  # 0.5 + 0.2 reaches 0.7
    assert kept(_filter(scores, 0, 0.71)) == [[1, 1, 1, 0, 0]]
    assert kept(_filter(scores, 0, 0.1)) == [[1, 0, 0, 0, 0]]  # the top token always stays
    assert kept(_filter(scores[:, [3, 0, 4, 1, 2]], 0, 0.7)) == [[0, 1, 0, 1, 0]]  # order does not matter


def test_top_k_sampling_only_draws_from_the_top_k(tiny_model):
    model, tok = tiny_model
    roll = generate(model, tok, ["3+4="], 64, max_new_tokens=1, top_k=1, seeds=[0])
    greedy = generate(model, tok, ["3+4="], max_new_tokens=1, greedy=True)
    assert set(roll.completions) == set(greedy.completions)


def _padded_three_rows():
    """Three rows of a padded batch, worked by hand: prompts of 2, 1 and 2 tokens left-padded to P = 2,
    completions of 3, 1 and 2 tokens right-padded to T = 3 (pad 0); row 2's middle token is the
    environment's (attention 1, loss mask 0)."""

    ids = torch.tensor([[11, 12, 21, 22, 23], [0, 13, 24, 0, 0], [14, 15, 25, 26, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    action = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0]])
    sampler = torch.tensor([[-0.1, -0.2, -0.3], [-0.4, 0.0, 0.0], [-0.5, 0.0, 0.0]])
    roll = rollout_from_padded(
        ["a"],
        3,
        ids,
        attention,
        action,
        torch.tensor([False, False, True]),
        sampler_logp=sampler,
        completions=["x", "y", "z"],
    )
    return roll, ids, attention, action, sampler


def test_a_rollout_s_rows_are_flat_and_its_padded_view_is_the_padded_batch_it_came_from():
    roll, ids, attention, action, sampler = _padded_three_rows()
    assert roll.tokens.tolist() == [11, 12, 21, 22, 23, 13, 24, 14, 15, 25, 26]  # no pad token anywhere
    assert roll.lengths.tolist() == [5, 2, 4] and roll.prompt_lengths.tolist() == [2, 1, 2]
    assert roll.loss_mask.tolist() == [0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0]
    assert roll.sampler_logp.tolist() == pytest.approx([0, 0, -0.1, -0.2, -0.3, 0, -0.4, 0, 0, -0.5, 0])
    assert roll.sampled_tokens().tolist() == [3, 1, 1]
    assert roll.completion_ids() == [[21, 22, 23], [24], [25, 26]]
    input_ids, mask, completion = padded(roll)
    assert torch.equal(input_ids, ids) and torch.equal(mask, attention) and torch.equal(completion, action)
    assert torch.equal(grid(roll, roll.sampler_logp), sampler)


def test_picking_groups_and_joining_rollouts_moves_whole_rows_without_re_padding():
    from grpo_cli.samples.rollout import concat_rollouts

    roll, *_ = _padded_three_rows()
    roll.group_size = 1
    roll.prompts = ["a", "b", "c"]
    picked = roll.select_groups([2, 1])
    assert picked.tokens.tolist() == [14, 15, 25, 26, 13, 24]
    assert picked.loss_mask.tolist() == [0, 0, 1, 0, 0, 1]
    assert picked.truncated.tolist() == [True, False] and picked.completions == ["z", "y"]
    picked.weight = torch.zeros(2)
    joined = concat_rollouts([roll.select_groups([1]), picked])
    assert joined.tokens.tolist() == [13, 24, 14, 15, 25, 26, 13, 24]
    assert joined.lengths.tolist() == [2, 4, 2] and joined.weight.tolist() == [1.0, 0.0, 0.0]
    # The joined padded view pads to the longest prompt and completion of all parts: P = 2, T = 2.
    assert padded(joined)[0].tolist() == [[0, 13, 24, 0], [14, 15, 25, 26], [0, 13, 24, 0]]


def test_decoding_stops_once_every_row_has_sampled_its_eos(tiny_model):
    """A row that ended may stay in the decode batch (rows leave it only in bulk); what it draws after
    its EOS must not keep the batch decoding: the last step is the longest completion's EOS. (Before the
    fix, three of these six batches of the built-in tiny model decoded three steps past it.)"""
    from grpo_cli.config import SamplerConfig
    from grpo_cli.generate.hf import decode, eos_token_ids

    model, tok = tiny_model
    prompts = [tok(p)["input_ids"] for p in ["3+4=", "12+30=", "7+7=", "40+2=", "99+99=", "5+5=", "123+4=", "1+1="]]
    eos = eos_token_ids(model, tok)
    stopped_early = 0
    for seed in range(6):
        tokens, _ = decode(
            model,
            prompts,
            4,
            SamplerConfig(max_new_tokens=40, temperature=3.0),
            eos_ids=eos,
            pad_id=tok.pad_token_id,
            seeds=[seed * 10 + i for i in range(8)],
        )
        mask, _ = completion_mask(tokens, eos)
        assert tokens.shape[1] == int(mask.sum(1).max()), seed
        stopped_early += tokens.shape[1] < 40
    assert stopped_early >= 3  # batches that ended before max_new_tokens: the ones the check is about


def test_the_fused_token_log_prob_and_its_gradient_equal_float64_log_softmax():
    """TokenLogProb (one temporary, its backward in place) against autograd's float64 log_softmax, an
    independent computation: values, entropy and the gradient for three upstream gradients."""
    from grpo_cli.models.logprobs import TokenLogProb

    torch.manual_seed(0)
    logits = torch.randn(6, 11) * 4
    targets = torch.tensor([0, 3, 10, 3, 7, 1])
    ref = logits.double().requires_grad_()
    want = torch.log_softmax(ref, -1).gather(-1, targets[:, None]).squeeze(-1)
    p = torch.softmax(ref.detach(), -1)
    for upstream in (torch.ones(6), torch.randn(6), torch.tensor([0.0, 2.0, -1.0, 0.5, 0.0, 3.0])):
        x = logits.clone().requires_grad_()
        logp, entropy = TokenLogProb.apply(x, targets, True)
        assert torch.allclose(logp.double(), want.detach(), atol=1e-6)
        assert torch.allclose(entropy.double(), -(p * p.log()).sum(-1), atol=1e-6)
        assert not entropy.requires_grad  # a constant, as the metric
        logp.backward(upstream)
        (grad,) = torch.autograd.grad(want, ref, upstream.double(), retain_graph=True)
        assert torch.allclose(x.grad.double(), grad, atol=1e-6)
    logp, _ = TokenLogProb.apply(logits.clone().requires_grad_(), targets, False)
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="ran twice"):  # its saved probabilities became the gradient
        logp.sum().backward()


def test_chunked_log_prob_gradients_through_the_model_equal_a_float64_full_vocabulary_forward(tiny_model):
    """Through chunks under activation checkpointing and the fused head: the gradient of a weighted sum
    of token log-probs with respect to every weight, against the model in float64 with a plain log_softmax."""
    import copy

    model, tok = tiny_model
    torch.manual_seed(0)
    roll = generate(model, tok, ["3+4=", "12+30=", "7+7="], 3, max_new_tokens=4, temperature=1.3)
    ids, attention, completion = padded(roll)
    T, m = roll.completion_len, completion.bool()
    weights = torch.randn(m.shape) * m
    reference = copy.deepcopy(model).double()
    for temperature in (1.0, 1.3):
        model.zero_grad(set_to_none=True)  # whatever another test left
        reference.zero_grad(set_to_none=True)
        got, _ = token_logprobs(
            model, ids, attention, T, temperature=temperature, chunk_tokens=5, with_entropy=True, packing=True
        )
        (got * weights).sum().backward()
        want = _full_vocab_logprobs(reference, ids, attention, T, temperature)
        (want * weights.double()).sum().backward()
        grads = [
            (name, a.grad.double(), b.grad) for (name, a), b in zip(model.named_parameters(), reference.parameters())
        ]
        model.zero_grad(set_to_none=True)  # the session's shared model keeps no gradients
        for name, a, b in grads:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (name, temperature)
