"""Expectations of grpo_cli.algo.objective on a K-armed bandit, computed by exact enumeration.

The policy is a categorical pi = softmax(theta) over K = 5 actions (float64 logits); a completion
is a single token, so every "sequence" has T = 1. Because the action set is tiny, an expectation
E_{a ~ p}[f(a)] is the finite sum sum_a p(a) f(a): no sampling, no Monte-Carlo noise, and the
identities of docs/math.md (the importance-weighted policy gradient, the clipped surrogate, and Schulman's k3) can be
checked to
round-off. The quantity under test always goes through ``policy_loss`` (or ``token_kl`` /
``group_advantages``) with autograd; the expected side is written from closed forms that do not
touch the code under test, chiefly grad_theta log softmax(theta)[a] = e_a - pi.

With B = 1 and T = 1 every aggregation divides by one and the token, sequence and sequence-mean
ratios are the same number, so those options coincide here; the tests loop over all of them
anyway, which pins that they agree on this degenerate shape.
"""

import itertools
import math

import torch

from grpo_cli.algo.objective import (
    AGGREGATIONS,
    RATIO_LEVELS,
    group_advantages,
    policy_loss,
    token_kl,
)
from helpers import flat_inputs

K = 5
DT = torch.float64
THETA = torch.tensor([0.3, -1.2, 0.8, 0.05, -0.4], dtype=DT)
PHI = torch.tensor([-0.5, 0.4, 1.1, -0.9, 0.2], dtype=DT)  # a behaviour policy != THETA
ADV = [1.3, -0.7, 2.1, 0.0, -1.9]  # arbitrary fixed per-action advantages A(a)
ALL_OPTIONS = list(itertools.product(AGGREGATIONS, RATIO_LEVELS))
TOL = dict(atol=1e-12, rtol=0)


def probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.detach(), dim=0)


def onehot(a: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(a), K).to(DT)


def loss_grad(theta, actions, advantages, old_logp=None, ref_logp=None, **kw):
    """grad_theta of policy_loss on the one-token completions `actions` (a batch of B = len).

    old_logp / ref_logp: length-K tensors of per-action log-probs (None: old = current theta,
    detached, so every ratio is 1). Returns (grad of the loss, loss, metrics).
    """
    theta = theta.detach().clone().requires_grad_(True)
    logp_all = torch.log_softmax(theta, dim=0)
    idx = torch.tensor(actions)
    logp = logp_all[idx].view(-1, 1)
    old = (logp_all.detach() if old_logp is None else old_logp)[idx].view(-1, 1)
    ref = None if ref_logp is None else ref_logp[idx].view(-1, 1)
    mask = torch.ones(len(actions), 1, dtype=torch.bool)
    adv = torch.as_tensor(advantages, dtype=DT).view(-1)
    loss, metrics = policy_loss(flat_inputs(logp, old, adv, mask, ref_logp=ref, **kw))
    metrics = {k: float(v) for k, v in metrics.items()}
    (grad,) = torch.autograd.grad(loss, theta)
    return grad, loss, metrics


# ------------------------------------------- the importance-weighted policy gradient (docs/math.md)


def test_expected_surrogate_gradient_at_theta_old_is_the_policy_gradient():
    # At theta = theta_old every ratio is 1, inside [1 - eps, 1 + eps], so min(rA, clip(r)A) has
    # the gradient of rA, and grad r = r grad log pi = e_a - pi. Hence
    # E_{a ~ pi}[grad(-L_a)] = sum_a pi(a) (e_a - pi) A(a), the likelihood-ratio policy gradient.
    pi = probs(THETA)
    expected = sum(pi[a] * (onehot(a) - pi) * ADV[a] for a in range(K))
    for aggregation, ratio_level in ALL_OPTIONS:
        got = torch.zeros(K, dtype=DT)
        for a in range(K):
            grad, _, metrics = loss_grad(THETA, [a], [ADV[a]], aggregation=aggregation, ratio_level=ratio_level)
            assert metrics["ratio_mean"] == 1.0
            got += pi[a] * -grad
        torch.testing.assert_close(got, expected, **TOL, msg=f"{aggregation}/{ratio_level}")
    # Not vacuous: the policy gradient is non-zero and not parallel to pi or to a one-hot.
    assert expected.abs().max() > 0.1


def test_importance_weighted_gradient_under_a_behaviour_policy_equals_the_on_policy_gradient():
    # docs/math.md, "The clipped surrogate": grad E_{a ~ phi}[r(a) A(a)] with r = pi_theta / pi_phi equals
    # E_{a ~ pi_theta}[(e_a - pi) A(a)]: phi(a) * r(a) = pi_theta(a) (change of measure).
    # The clip window (0.001, 1e9) contains every ratio here, so the surrogate is unclipped.
    pi, phi = probs(THETA), probs(PHI)
    log_phi = torch.log_softmax(PHI, dim=0)
    ratios = pi / phi
    assert ratios.min() > 0.01 and ratios.max() < 100
    expected = sum(pi[a] * (onehot(a) - pi) * ADV[a] for a in range(K))
    for aggregation, ratio_level in ALL_OPTIONS:
        got = torch.zeros(K, dtype=DT)
        for a in range(K):
            grad, _, metrics = loss_grad(
                THETA,
                [a],
                [ADV[a]],
                old_logp=log_phi,
                clip_eps=0.999,
                clip_eps_high=1e9,
                aggregation=aggregation,
                ratio_level=ratio_level,
            )
            assert math.isclose(metrics["ratio_mean"], float(ratios[a]), rel_tol=1e-12)
            got += phi[a] * -grad
        torch.testing.assert_close(got, expected, **TOL, msg=f"{aggregation}/{ratio_level}")

    # Not vacuous: some ratios leave the default window [0.8, 1.2], and with the default
    # clip_eps = 0.2 the phi-weighted gradient is no longer the on-policy one.
    assert ((ratios < 0.8) | (ratios > 1.2)).any()
    clipped = sum(phi[a] * -loss_grad(THETA, [a], [ADV[a]], old_logp=log_phi)[0] for a in range(K))
    assert (clipped - expected).abs().max() > 1e-3


# ------------------------------------------------------------------ the clipped surrogate


def test_clipping_gives_zero_gradient_when_the_ratio_is_past_the_trust_region_in_the_advantage_direction():
    # min(rA, clip(r, 1 - lo, 1 + hi) A) is the constant clip(r) A once r has moved past the
    # window in the direction A favours (r > 1 + hi with A > 0, r < 1 - lo with A < 0): zero
    # gradient, exactly. In the opposite direction the min picks rA, whose gradient is
    # A r (e_a - pi). Cases: (ratio, advantage, clip_eps, clip_eps_high, clipped?, which metric).
    cases = [
        (1.5, +1.7, 0.2, None, True, "clip_frac_high"),
        (0.5, -1.7, 0.2, None, True, "clip_frac_low"),
        (1.5, -1.7, 0.2, None, False, None),
        (0.5, +1.7, 0.2, None, False, None),
        # Asymmetric window (clip-higher): 1.25 is inside [0.8, 1.28], 1.3 and 0.75 are not.
        (1.25, +1.7, 0.2, 0.28, False, None),
        (1.30, +1.7, 0.2, 0.28, True, "clip_frac_high"),
        (0.75, -1.7, 0.2, 0.28, True, "clip_frac_low"),
    ]
    pi = probs(THETA)
    logp_all = torch.log_softmax(THETA, dim=0)
    for a in (0, 3):
        for r, adv, lo, hi, clipped, metric in cases:
            old = logp_all.clone()
            old[a] = logp_all[a] - math.log(r)  # so that pi_theta(a) / old(a) = r
            for aggregation, ratio_level in ALL_OPTIONS:
                grad, _, metrics = loss_grad(
                    THETA,
                    [a],
                    [adv],
                    old_logp=old,
                    clip_eps=lo,
                    clip_eps_high=hi,
                    aggregation=aggregation,
                    ratio_level=ratio_level,
                )
                where = f"a={a} r={r} A={adv} {aggregation}/{ratio_level}"
                assert math.isclose(metrics["ratio_mean"], r, rel_tol=1e-12), where
                if clipped:
                    assert torch.equal(grad, torch.zeros(K, dtype=DT)), where
                    assert metrics[metric] == 1.0, where
                else:
                    expected = adv * r * (onehot(a) - pi)
                    torch.testing.assert_close(-grad, expected, **TOL, msg=where)
                    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0, where


# ------------------------------------------------------------------------ Schulman's k3


def exact_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return sum(pa * math.log(pa / qa) for pa, qa in zip(p.tolist(), q.tolist()))


def test_k3_expectation_equals_the_exact_kl_and_is_never_negative():
    gen = torch.Generator().manual_seed(4)
    for _ in range(8):
        theta = 2.0 * torch.randn(K, generator=gen, dtype=DT)
        ref_theta = 2.0 * torch.randn(K, generator=gen, dtype=DT)
        pi, ref = probs(theta), probs(ref_theta)
        logp, ref_logp = torch.log_softmax(theta, 0), torch.log_softmax(ref_theta, 0)
        kl = exact_kl(pi, ref)
        assert kl > 1e-3
        # All K actions enumerated as one batch; the expectation is the pi-weighted sum.
        # E_pi[ref/pi - log(ref/pi) - 1] = sum ref - 1 + KL = KL; E_pi[k1] = KL by definition.
        for estimator in ("k3", "k1"):
            e_k = float((pi * token_kl(logp, ref_logp, estimator)).sum())
            assert abs(e_k - kl) < 1e-12, estimator

    # k3 = exp(-x) + x - 1 with x = log(pi / ref) is >= 0 (convexity of exp), = 0 only at x = 0.
    grid = torch.linspace(-20.0, 20.0, 4001, dtype=DT)
    k3 = token_kl(grid, torch.zeros_like(grid), "k3")
    assert (k3 >= 0).all()
    assert (k3[grid.abs() > 1e-3] > 0).all()
    assert token_kl(torch.zeros(1, dtype=DT), torch.zeros(1, dtype=DT), "k3").item() == 0.0
    # Near x = 0 from below (pi a hair under ref) the naive exp(-x) + x - 1 rounds to -1.1e-16;
    # token_kl computes expm1(-x) + x, which stays >= 0 to the last bit.
    tiny = torch.logspace(-20, -1, 2001, dtype=DT)
    for x in (tiny, -tiny):
        assert (token_kl(x, torch.zeros_like(x), "k3") >= 0).all()


def test_expected_gradient_of_the_per_sample_k3_penalty_is_pi_minus_ref():
    # Through policy_loss with A = 0 and beta > 0, the per-action loss is beta * k3(a) with the
    # action a held fixed. grad_theta k3(a) = (1 - ref(a)/pi(a)) (e_a - pi), so
    #   E_{a ~ pi}[grad k3(a)] = sum_a (pi(a) - ref(a)) (e_a - pi) = pi - ref,
    # which is grad_theta KL(ref || pi_theta) (the *reverse* KL), NOT grad_theta KL(pi || ref) =
    # pi * (log(pi / ref) - KL). The two agree only where both vanish, at pi = ref. The loss
    # values, by contrast, do average to KL(pi || ref) (previous test). So only assert that.
    beta = 0.3
    gen = torch.Generator().manual_seed(7)
    theta = 1.5 * torch.randn(K, generator=gen, dtype=DT)
    ref_theta = 1.5 * torch.randn(K, generator=gen, dtype=DT)
    pi, ref = probs(theta), probs(ref_theta)
    ref_logp = torch.log_softmax(ref_theta, 0)
    zero = [0.0]

    got = torch.zeros(K, dtype=DT)
    expected_loss = 0.0
    for a in range(K):
        grad, loss, metrics = loss_grad(theta, [a], zero, ref_logp=ref_logp, beta=beta)
        got += pi[a] * grad
        expected_loss += pi[a].item() * loss.item()
    torch.testing.assert_close(got, beta * (pi - ref), **TOL)
    assert abs(expected_loss - beta * exact_kl(pi, ref)) < 1e-12
    forward_kl_grad = pi * (torch.log(pi / ref) - exact_kl(pi, ref))
    assert (got - beta * forward_kl_grad).abs().max() > 1e-2  # genuinely a different vector

    # At theta = ref: every per-action loss is exactly zero and so is every gradient.
    for a in range(K):
        grad, loss, metrics = loss_grad(ref_theta, [a], zero, ref_logp=ref_logp, beta=beta)
        assert loss.item() == 0.0 and metrics["kl"] == 0.0
        torch.testing.assert_close(grad, torch.zeros(K, dtype=DT), atol=1e-15, rtol=0)


# ---------------------------------------------------------- whole groups of two, fully enumerated

EPS = 1e-6  # group_advantages' default


def psi(x: float) -> float:
    """Advantage of the first of two rewards R1 - R2 = x: (x/2) / sqrt((x/2)^2 + eps^2)."""
    return (x / 2) / math.sqrt((x / 2) ** 2 + EPS**2)


def test_group_of_two_whitened_advantages_are_plus_or_minus_one_for_every_enumerated_pair():
    # Seed 000 eq. 1-2 with m = 2: mu = (R1 + R2)/2, sigma = sqrt(((R1 - R2)/2)^2 + eps^2), so
    # A = (+psi(R1 - R2), -psi(R1 - R2)): +-1 up to eps, and exactly 0 for a tie.
    rewards = [0.0, 1.0, 0.25, 3.0, 1.0]
    pairs = list(itertools.product(range(K), repeat=2))
    got = group_advantages(torch.tensor([[rewards[i], rewards[j]] for i, j in pairs], dtype=DT))
    for (i, j), row in zip(pairs, got.tolist()):
        d = rewards[i] - rewards[j]
        assert abs(row[0] - psi(d)) < 1e-12 and abs(row[1] + psi(d)) < 1e-12, (i, j)
        if d == 0:
            assert row == [0.0, 0.0]
    # A hand number: [3, 1] -> 1 / sqrt(1 + 1e-12) = 1 - 5e-13.
    assert abs(group_advantages(torch.tensor([[3.0, 1.0]], dtype=DT))[0, 0].item() - (1 - 5e-13)) < 1e-15


def expected_group_gradient(theta, rewards):
    """E over both draws of a group of 2 from pi_theta of grad(-policy_loss), all K^2 pairs."""
    n = theta.numel()
    pi = probs(theta)
    total = torch.zeros(n, dtype=DT)
    for i, j in itertools.product(range(n), repeat=2):
        adv = group_advantages(torch.tensor([[rewards[i], rewards[j]]], dtype=DT))[0]
        grad, _, _ = loss_grad(theta, [i, j], adv)
        total += pi[i] * pi[j] * -grad
    return total


def policy_gradients(theta, rewards):
    """(expected GRPO gradient in closed form, grad J) for groups of two drawn from pi_theta.

    The draw j of a group gets advantage psi(R(a_j) - R(other)); averaging over the other draw,
    E[grad] = sum_a pi(a) (e_a - pi) Rt(a) with Rt(a) = sum_b pi(b) psi(R(a) - R(b)): the policy
    gradient of the pairwise "beats an independent draw" score Rt (held fixed), whose pi-mean is
    zero because psi is odd, so E[grad] = pi * Rt. grad J = pi * (R - J) for J = sum pi R.
    """
    n = theta.numel()
    pi = probs(theta)
    rt = torch.tensor(
        [sum(pi[b].item() * psi(rewards[a] - rewards[b]) for b in range(n)) for a in range(n)],
        dtype=DT,
    )
    r = torch.tensor(rewards, dtype=DT)
    return pi * rt, pi * (r - (pi * r).sum()), rt


def test_expected_gradient_over_all_groups_of_two_is_the_policy_gradient_of_a_pairwise_win_score():
    rewards = [0.0, 1.0, 0.25, 3.0, 1.0]
    for theta in (THETA, PHI, torch.zeros(K, dtype=DT)):
        got = expected_group_gradient(theta, rewards)
        closed, grad_j, rt = policy_gradients(theta, rewards)
        torch.testing.assert_close(got, closed, **TOL)
        pi = probs(theta)
        r = torch.tensor(rewards, dtype=DT)
        # Rt is an increasing function of R, so Cov_pi(R, Rt) > 0: in the Fisher geometry of the
        # softmax (natural gradient) the expected GRPO step always increases J to first order.
        cov = (pi * (r - (pi * r).sum()) * rt).sum()
        assert cov > 0.05
        # At these points the plain (Euclidean) inner product with grad J is positive too.
        assert torch.dot(got, grad_j) > 0.01


def test_expected_group_of_two_gradient_can_point_against_the_expected_reward_gradient():
    # Not a bug in the code but a property of whitening with m = 2: advantages are +-1 whatever
    # the size of the reward gap, so a rare action with a huge reward (R = 100 at pi ~ 0.005)
    # weighs no more than a small win. With pi concentrated on action 1 (R = 2), the expected
    # GRPO gradient has a NEGATIVE inner product with grad J (a K = 4 counterexample; a
    # reviewer should not expect "E[grad] . grad J > 0" in general, only at e.g. uniform pi).
    theta = torch.tensor([0.0, 4.0, -1.0, 1.0], dtype=DT)
    rewards = [0.0, 2.0, 100.0, 1.0]
    got = expected_group_gradient(theta, rewards)
    closed, grad_j, _ = policy_gradients(theta, rewards)
    torch.testing.assert_close(got, closed, **TOL)
    cos = torch.dot(got, grad_j) / (got.norm() * grad_j.norm())
    assert cos < -0.3
    # ...while at uniform pi the same rewards give a positive inner product.
    uniform = torch.zeros(4, dtype=DT)
    got_u = expected_group_gradient(uniform, rewards)
    assert torch.dot(got_u, policy_gradients(uniform, rewards)[1]) > 0
