"""The head's log-prob and entropy (models/logprobs.py) against float64: the logged entropy keeps float32's
precision at the temperatures runs use, and the log-probs and their gradient are the full softmax's."""

import pytest
import torch

from grpo_cli.models import logprobs
from grpo_cli.models.logprobs import _chunk


def lm_logits(rows: int = 96, vocab: int = 32_000, seed: int = 0) -> torch.Tensor:
    """Logits shaped like a language model's: a broad body, a few tokens far above it, an offset of 20."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 2.5 + 20.0
    peaks = torch.randint(0, vocab, (rows, 4), generator=g)
    return logits.scatter_add(1, peaks, torch.rand(rows, 4, generator=g) * 12.0)


def float64_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    log_p = (logits.double() / temperature).log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def entropies(logits: torch.Tensor, temperature: float) -> dict[str, torch.Tensor]:
    """The logged entropy (no gradient), the entropy bonus's (with gradient), and the formula the logged one
    replaced: lse - sum_v p_v logit_v on the unshifted float32 logits, the dot product batched."""
    targets = torch.zeros(len(logits), dtype=torch.long)
    _, logged = _chunk(lambda x: x, logits, targets, temperature, with_entropy=True)
    _, bonus = _chunk(lambda x: x, logits.clone().requires_grad_(True), targets, temperature, True, entropy_grad=True)
    t = logits / temperature
    before = t.logsumexp(-1) - torch.bmm(t.softmax(-1).unsqueeze(1), t.unsqueeze(2)).view(-1)
    return {"logged": logged, "bonus": bonus.detach(), "before": before}


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_entropy_is_float64_s_but_for_the_tempered_logits_own_rounding(temperature, monkeypatch):
    """Against float64 over the same float32 logits: the formula's error stays under 1e-6. The rest of the
    error (2.5e-6 at 0.7, on this data) is the float32 division by the temperature, which rounds each logit:
    the float64 entropy of the float32-divided logits is off by as much."""
    logits = lm_logits()
    monkeypatch.setattr(logprobs, "ENTROPY_BYTES", 7 * logits.shape[-1] * 4)  # 7 rows a slice: the last one short
    found = entropies(logits, temperature)
    exact = float64_entropy(logits, temperature)
    of_rounded_input = float64_entropy(logits / temperature, 1.0)  # float64 from the float32-divided logits
    for name in ("logged", "bonus"):
        assert (found[name].double() - of_rounded_input).abs().max().item() < 1e-6, name
        assert (found[name].double() - exact).abs().max().item() < 5e-6, name
    # as precise as the formula it replaced, or better: here by two orders of magnitude
    assert (found["logged"].double() - exact).abs().max() * 10 < (found["before"].double() - exact).abs().max()


def test_log_probs_and_their_gradient_are_the_full_softmax_s():
    logits = lm_logits(rows=8, vocab=500).requires_grad_(True)
    targets = torch.arange(8) * 7
    logp, _ = _chunk(lambda x: x, logits, targets, 0.7, with_entropy=False)
    logp.sum().backward()
    x = logits.detach().double().requires_grad_(True)
    reference = (x / 0.7).log_softmax(-1)[torch.arange(8), targets]
    reference.sum().backward()
    assert torch.allclose(logp.double(), reference, atol=1e-5, rtol=0)
    assert torch.allclose(logits.grad.double(), x.grad, atol=1e-6, rtol=0)
