"""The registered policy losses (CISPO, SAPO, dual-clip) and the entropy bonus: values and gradients
worked by hand (math module, not torch), and the registry that lets a loss be added from outside."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_cli.algo.losses import POLICY_LOSSES, register_loss
from grpo_cli.algo.objective import policy_loss
from helpers import flat_inputs


def _logps(*probs: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


def _loss_and_grad(logp_probs, old_probs, adv, **kw):
    logp = _logps(*logp_probs).requires_grad_(True)
    old = _logps(*old_probs)
    mask = torch.ones_like(old)
    loss, metrics = policy_loss(flat_inputs(logp, old, torch.tensor([adv], dtype=torch.float64), mask, beta=0.0, **kw))
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


def test_cispo_weights_reinforce_by_the_capped_ratio_and_keeps_the_gradient_of_clipped_tokens():
    # token 1: r = 0.5 / 0.25 = 2, capped at 1.5; token 2: r = 0.2 / 0.4 = 0.5. A = 1, token mean.
    loss, grad, m = _loss_and_grad(
        (0.5, 0.2), (0.25, 0.4), 1.0, loss="cispo", loss_args={"ratio_max": 1.5}, aggregation="token_mean"
    )
    by_hand = (-1.5 * math.log(0.5) - 0.5 * math.log(0.2)) / 2  # -sg(min(r, 1.5)) * A * log pi, averaged
    assert loss == pytest.approx(by_hand, rel=1e-12)
    assert grad == pytest.approx([-1.5 / 2, -0.5 / 2], rel=1e-12)  # d/dlog pi = -w A / tokens
    assert float(m["cispo_capped_frac"]) == 0.5
    # The clipped surrogate drops token 1's gradient entirely (r = 2 > 1.2 with A > 0): CISPO's point.
    _, clip_grad, _ = _loss_and_grad((0.5, 0.2), (0.25, 0.4), 1.0, aggregation="token_mean")
    assert clip_grad[0] == 0.0


def test_sapo_gate_is_the_surrogate_at_ratio_one_and_smooth_elsewhere():
    # Token 1: r = 1, A = 2, tau_pos = 1: loss -(4/tau) sigmoid(0) A = -2A/tau; gradient -4 s(1-s) r A = -A.
    loss, grad, _ = _loss_and_grad((0.3,), (0.3,), 2.0, loss="sapo", loss_args={"tau_pos": 1.0, "tau_neg": 1.05})
    assert loss == pytest.approx(-4.0, rel=1e-12)
    assert grad == pytest.approx([-2.0], rel=1e-12)
    # Token with r = e^0.5 and A = -1 uses tau_neg = 1.05.
    r, tau, a = math.exp(0.5), 1.05, -1.0
    s = 1 / (1 + math.exp(-tau * (r - 1)))
    loss, grad, _ = _loss_and_grad(
        (math.exp(-1.0),), (math.exp(-1.5),), a, loss="sapo", loss_args={"tau_pos": 1.0, "tau_neg": tau}
    )
    assert loss == pytest.approx(-(4 / tau) * s * a, rel=1e-12)
    assert grad == pytest.approx([-4 * s * (1 - s) * r * a], rel=1e-12)  # d r / d log pi = r


@pytest.mark.parametrize(
    "adv, ratio, plain, dual, dual_grad",
    [
        (-1.0, 5.0, 5.0, 3.0, 0.0),  # A < 0, r above c = 3: the loss is capped at -c A, no gradient
        (-1.0, 2.0, 2.0, 2.0, 2.0),  # A < 0, r below c: the clipped surrogate, gradient -A r
        (1.0, 5.0, -1.2, -1.2, 0.0),  # A > 0: dual-clip never applies (clipped at 1 + eps)
    ],
)
def test_dual_clip_caps_negative_advantage_tokens_at_c(adv, ratio, plain, dual, dual_grad):
    probs, old = (0.5,), (0.5 / ratio,)
    loss, _, _ = _loss_and_grad(probs, old, adv)
    assert loss == pytest.approx(plain, rel=1e-12)
    loss, grad, m = _loss_and_grad(probs, old, adv, clip_ratio_c=3.0)
    assert loss == pytest.approx(dual, rel=1e-12)
    assert grad == pytest.approx([dual_grad], abs=1e-12)
    assert float(m["dual_clip_frac"]) == (1.0 if dual != plain else 0.0)


def test_entropy_bonus_subtracts_coef_times_the_steps_token_mean_entropy():
    logp = _logps(0.5, 0.5, 0.5).requires_grad_(True)
    entropy = torch.tensor([[0.7, 1.1, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)  # the third token is padding
    adv = torch.tensor([0.0], dtype=torch.float64)  # no policy term: the loss is the bonus alone
    loss, _ = policy_loss(
        flat_inputs(logp, logp.detach(), adv, mask, entropy=entropy, entropy_coef=0.1, num_tokens=4.0)
    )
    assert loss.item() == pytest.approx(-0.1 * (0.7 + 1.1) / 4.0, rel=1e-12)  # normalised by the whole step's 4 tokens
    loss.backward()
    assert entropy.grad[0].tolist() == pytest.approx([-0.1 / 4.0, -0.1 / 4.0, 0.0], rel=1e-12)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(flat_inputs(logp, logp.detach(), adv, mask, entropy_coef=0.1))


def test_entropy_with_gradient_matches_a_full_vocabulary_computation(tiny_model):
    from helpers import token_logprobs

    model, _ = tiny_model
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 7))
    mask = torch.ones_like(ids)
    _, entropy = token_logprobs(model, ids, mask, 4, temperature=0.7, entropy_grad=True, chunk_tokens=3)
    grads = torch.autograd.grad(entropy.sum(), [p for p in model.parameters() if p.requires_grad])
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -5:-1].float() / 0.7
    p = logits.softmax(-1)
    expected = -(p * logits.log_softmax(-1)).sum(-1)
    assert torch.allclose(entropy, expected, atol=1e-5)
    want = torch.autograd.grad(expected.sum(), [p for p in model.parameters() if p.requires_grad])
    for g, w in zip(grads, want):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-4)
    _, constant = token_logprobs(model, ids, mask, 4, with_entropy=True)
    assert not constant.requires_grad  # the logged entropy stays a constant without a bonus


def test_a_loss_registered_from_outside_the_package_is_used_by_name():
    @register_loss("test_reinforce", scale=1.0)
    def reinforce(t):
        return -t.args["scale"] * t.advantages * t.logp, {}

    try:
        loss, grad, _ = _loss_and_grad((0.5,), (0.5,), 2.0, loss="test_reinforce", loss_args={"scale": 3.0})
        assert loss == pytest.approx(-3.0 * 2.0 * math.log(0.5), rel=1e-12)
        assert grad == pytest.approx([-6.0], rel=1e-12)
    finally:
        POLICY_LOSSES.pop("test_reinforce")


def test_the_loss_registry_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, grpo_cli.algo.losses\nfrom grpo_cli.config import TrainConfig, check\ncheck(TrainConfig())\n"
        "print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
