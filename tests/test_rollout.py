import torch

from grpo_cli.logprobs import token_logprobs
from grpo_cli.rollout import completion_mask
from helpers import generate


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
        got, ent = token_logprobs(model, roll.input_ids, roll.attention_mask, T, temperature=temperature,
                                  chunk_tokens=5, with_entropy=True)
        want = _full_vocab_logprobs(model, roll.input_ids, roll.attention_mask, T, temperature)
        m = roll.completion_mask.bool()
        assert torch.allclose(got[m].double(), want[m], atol=1e-5)
        assert (ent[m] >= 0).all()


def test_scored_logprobs_match_the_distribution_generate_sampled_from(tiny_model):
    """Left padding must not shift positions: the loss scores tokens exactly as generate saw them."""
    model, tok = tiny_model
    enc = tok(["3+4=", "12+30="], return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=3, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tok.pad_token_id, eos_token_id=[tok.eos_token_id])
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
    assert roll.input_ids.shape[0] == 8 and len(roll.completions) == 8
    assert roll.completion_mask.shape == (8, roll.completion_len)
    after = roll.completion_mask == 0
    assert (roll.input_ids[:, -roll.completion_len :][after] == tok.pad_token_id).all()
    assert (roll.attention_mask[:, -roll.completion_len :] == roll.completion_mask).all()
