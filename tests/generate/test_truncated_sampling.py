"""Top-k and top-p sampling, unbiased (docs/math.md, "Truncated sampling"): the sampler's log-prob of a token is
its log-probability renormalised over the kept set, the correction weighs each token by the kept mass, and the
weighted estimator's expectation is the policy's own over the tokens the sampler can draw. By hand on a
five-token vocabulary, then on the tiny model against an independent forward, then in a run."""

import math

import pytest
import torch

from grpo_cli.algo.objective import sampler_correction_weight
from grpo_cli.config import SamplerConfig
from grpo_cli.generate.sampling import pick
from helpers import generate, grid, grpo, metric_rows, padded

PROBS = [0.45, 0.4, 0.07, 0.05, 0.03]  # the policy's (tempered) distribution over five tokens
# top-p 0.8: 0.45 < 0.8 keeps token 1, 0.85 >= 0.8 stops before token 2: kept {0, 1}, mass 0.85.
# top-k 3: kept {0, 1, 2}, mass 0.92.
CASES = [(dict(top_p=0.8), [0, 1], 0.85), (dict(top_k=3), [0, 1, 2], 0.92)]


def draws(settings: dict, rows: int = 64):
    """`rows` tokens drawn by the generator's own choice from PROBS, each with the log-prob the decoder records."""
    logits = torch.log(torch.tensor([PROBS] * rows))
    s = SamplerConfig(max_new_tokens=1, temperature=1.0, **settings)
    noise = torch.empty(rows, len(PROBS)).uniform_(generator=torch.Generator().manual_seed(0)).log().neg().log()
    return pick(logits, noise, s.temperature, s.top_k, s.top_p, logprobs=True)


@pytest.mark.parametrize("settings,kept,mass", CASES)
def test_each_sampled_token_s_log_prob_is_renormalised_over_the_kept_set(settings, kept, mass):
    tokens, logp = draws(settings)
    assert set(tokens.tolist()) <= set(kept)  # never a token outside the kept set
    assert len(set(tokens.tolist())) > 1  # and the draw is a draw, not the top token every time
    expected = torch.tensor([math.log(PROBS[t] / mass) for t in tokens.tolist()])
    assert torch.allclose(logp, expected, atol=1e-6)


@pytest.mark.parametrize("settings,kept,mass", CASES)
def test_the_correction_weighs_each_token_by_the_kept_mass(settings, kept, mass):
    """On-policy at the sampling step the trainer's log-prob is the whole distribution's: pi / q = S, under the cap."""
    tokens, logp = draws(settings)
    trainer = torch.log(torch.tensor(PROBS))[tokens]
    weight = sampler_correction_weight(trainer, logp, cap=2.0)
    assert torch.allclose(weight, torch.full_like(weight, mass), atol=1e-6)


@pytest.mark.parametrize("settings,kept,mass", CASES)
def test_the_corrected_estimator_s_expectation_is_the_policy_s_over_the_kept_set(settings, kept, mass):
    """By enumeration over every token the sampler can draw: E_q[w f] = sum over K of pi f; uncorrected, 1/S of it."""
    f = torch.tensor([3.0, -1.0, 2.0, 5.0, 7.0])  # any per-token term: a surrogate's gradient, say
    pi = torch.tensor(PROBS)
    q = torch.zeros(5)
    q[kept] = pi[kept] / mass  # the kept set renormalised, as test_each_sampled_token... checks the decoder records
    w = sampler_correction_weight(pi.log()[kept], q.log()[kept], cap=2.0)
    corrected = (q[kept] * w * f[kept]).sum()
    target = {0.85: 0.45 * 3 - 0.4 * 1, 0.92: 0.45 * 3 - 0.4 * 1 + 0.07 * 2}[mass]  # sum over K of pi f, by hand
    assert corrected.item() == pytest.approx(target, abs=1e-6)
    assert (q[kept] * f[kept]).sum().item() == pytest.approx(target / mass, abs=1e-6)


def kept_mass(probs: list[float], top_k: int, top_p: float) -> tuple[set[int], float]:
    """The kept set and its mass, by sorting in Python: top-k first, then top-p over what it kept, renormalised."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept = order[:top_k] if top_k else order
    total, before, nucleus = sum(probs[i] for i in kept), 0.0, []
    for i in kept:
        if before >= top_p:
            break
        nucleus.append(i)
        before += probs[i] / total
    return set(nucleus), sum(probs[i] for i in nucleus)


@pytest.mark.parametrize("top_k,top_p", [(0, 0.8), (3, 1.0), (5, 0.9)])
def test_the_decoder_records_the_kept_set_s_log_probs_on_a_model(tiny_model, top_k, top_p):
    """Every decoded token of the tiny model: in its step's kept set, its sampler log-prob log(pi / S), where pi and
    S come from an independent forward over the finished row."""
    model, tok = tiny_model
    prompts, temperature = ["3+4=", "12+30=", "7+7="], 1.3
    roll = generate(
        model, tok, prompts, 4, max_new_tokens=5, temperature=temperature, top_p=top_p, top_k=top_k,
        seeds=[0, 1, 2], with_logprobs=True,
    )  # fmt: skip
    ids, attention, completion = padded(roll)
    recorded = grid(roll, roll.sampler_logp)
    checked = 0
    for b in range(ids.shape[0]):
        row = ids[b][attention[b].bool()]
        n = int(completion[b].sum())
        with torch.no_grad():
            logits = model(input_ids=row[None]).logits[0].float() / temperature
        for t in range(n):
            at = len(row) - n + t
            probs = logits[at - 1].softmax(-1).tolist()
            token = int(row[at])
            kept, mass = kept_mass(probs, top_k, top_p)
            assert token in kept
            assert recorded[b, t].item() == pytest.approx(math.log(probs[token] / mass), abs=1e-4)
            checked += 1
    assert checked >= 12


def test_a_top_p_run_logs_the_sampler_gap_every_step(tmp_path):
    assert grpo("train", f"output_dir={tmp_path}/run", "trainer.steps=2", "sampler.top_p=0.9") == 0
    rows = metric_rows(tmp_path / "run", training=True)
    assert len(rows) == 2
    assert all(r["sampler/logp_diff"] > 0 for r in rows), [r.get("sampler/logp_diff") for r in rows]


def test_without_truncation_no_sampler_log_probs_are_asked_for(tmp_path):
    assert grpo("train", f"output_dir={tmp_path}/run", "trainer.steps=1") == 0
    assert "sampler/logp_diff" not in metric_rows(tmp_path / "run", training=True)[0]
