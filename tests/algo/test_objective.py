"""The seed math of grpo_cli.algo.objective, checked against hand numbers and loop-written references."""

import math

import pytest
import torch

from grpo_cli.algo.objective import (
    AGGREGATIONS,
    RATIO_LEVELS,
    LossInputs,
    group_advantages,
    policy_loss,
    token_kl,
)
from helpers import flat_inputs, floats

# ---------------------------------------------------------------------------- group_advantages


def test_toy_example_of_seed_003_gives_sqrt3_and_minus_one_over_sqrt3():
    # Seed 003, "17 x 12": rewards [1, 0, 0, 0], mu = 0.25, sigma = sqrt(0.75 / 4) = 0.4330.
    # The seed prints +1.75 for the correct answer; that is a rounding slip: 0.75 / 0.4330 = 1.732
    # (= sqrt(3)), and the wrong answers get -0.25 / 0.4330 = -0.577 (= -1 / sqrt(3)).
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    expected = torch.tensor([[1.7320508, -0.5773503, -0.5773503, -0.5773503]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (8, 16)])
def test_advantages_are_invariant_to_positive_affine_reward_changes(seed, shape):
    # docs/math.md, invariance to aR + b: aR + b with a > 0 leaves A unchanged (up to eps).
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(shape, generator=gen, dtype=torch.float64)
    for a, b in [(0.5, 3.0), (7.0, -2.0), (1.0, 100.0)]:
        torch.testing.assert_close(group_advantages(a * rewards + b), group_advantages(rewards), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (8, 16)])
def test_advantages_have_zero_mean_and_unit_population_variance_per_group(seed, shape):
    # docs/math.md, zero mean and unit variance: (1/m) sum_j A_ij = 0 and (1/m) sum_j A_ij^2 = 1 (up to eps).
    gen = torch.Generator().manual_seed(100 + seed)
    rewards = 3.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
    adv = group_advantages(rewards)
    for row in adv.tolist():
        assert abs(sum(row) / len(row)) < 1e-9
        assert abs(sum(x * x for x in row) / len(row) - 1.0) < 1e-6


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("std", ["population", "sample"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_a_flat_group_gets_exactly_zero_advantages_and_no_nan(scale, std, eps):
    # 0.4900934... is a float32 whose mean over three copies misses it by an ulp; divided by
    # sigma ~ eps, that ulp would become a spurious advantage.
    odd = 0.4900934100151062
    rewards = torch.tensor([[odd, odd, odd], [0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [1.0, 2.0, 3.0]])
    assert rewards[0].mean() != rewards[0, 0]  # the premise of this test
    adv = group_advantages(rewards, scale=scale, std=std, eps=eps)
    assert not torch.isnan(adv).any()
    assert torch.equal(adv[:3], torch.zeros(3, 3))
    assert adv[3, 0] < 0 < adv[3, 2]


def test_an_all_flat_batch_gets_zero_advantages_even_with_batch_scale_and_no_eps():
    adv = group_advantages(torch.full((2, 4), 0.3), scale="batch", eps=0.0)
    assert torch.equal(adv, torch.zeros(2, 4))


def test_sample_std_divides_the_sum_of_squares_by_group_size_minus_one():
    # mu = 0.25; sum of squares 0.75; sample var 0.75 / 3 = 0.25, sigma = 0.5.
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), std="sample")
    torch.testing.assert_close(adv, torch.tensor([[1.5, -0.5, -0.5, -0.5]]), atol=1e-5, rtol=0)


BATCH_REWARDS = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]


def test_no_scale_only_subtracts_the_group_mean():
    adv = group_advantages(torch.tensor(BATCH_REWARDS), scale="none")
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]])
    assert torch.equal(adv, expected)


@pytest.mark.parametrize("std, divisor", [("population", 8), ("sample", 7)])
def test_batch_scale_divides_group_centred_rewards_by_the_batch_std(std, divisor):
    # Batch mean 3/8; three 1s at +0.625 and five 0s at -0.375: sum of squares 1.171875 + 0.703125.
    sigma = math.sqrt((3 * 0.625**2 + 5 * 0.375**2) / divisor + 1e-12)
    adv = group_advantages(torch.tensor(BATCH_REWARDS, dtype=torch.float64), scale="batch", std=std)
    expected = [
        [0.75 / sigma, -0.25 / sigma, -0.25 / sigma, -0.25 / sigma],
        [0.5 / sigma, 0.5 / sigma, -0.5 / sigma, -0.5 / sigma],
    ]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_advantages_are_detached_float32_or_float64():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 5.0]], requires_grad=True)
    adv = group_advantages(rewards)
    assert not adv.requires_grad and adv.dtype == torch.float32
    assert group_advantages(torch.tensor([[1, 0], [2, 5]])).dtype == torch.float32
    assert group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16)).dtype == torch.float32
    assert group_advantages(rewards.detach().double()).dtype == torch.float64


@pytest.mark.parametrize(
    "rewards, kwargs, message",
    [
        (torch.zeros(4), {}, "2-D"),
        (torch.zeros(2, 3, 4), {}, "2-D"),
        (torch.zeros(2, 0), {}, "2-D"),
        (torch.zeros(2, 3), {"scale": "prompt"}, "advantage scale"),
        (torch.zeros(2, 3), {"std": "unbiased"}, "std kind"),
        (torch.zeros(2, 1), {"std": "sample"}, "at least two"),
        (torch.zeros(1, 1), {"std": "sample", "scale": "batch"}, "at least two"),
        (torch.zeros(2, 3), {"eps": -1.0}, "eps"),
    ],
)
def test_bad_advantage_arguments_raise_value_error(rewards, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, **kwargs)


# ------------------------------------------------------------------------------------ token_kl


def test_kl_estimators_match_hand_values():
    # pi = 0.5, pi_ref = 0.25: log(pi / pi_ref) = ln 2; k3 = 0.5 + ln 2 - 1.
    # pi = 0.2, pi_ref = 0.6: log(pi / pi_ref) = -ln 3; k3 = 3 - ln 3 - 1.
    logp = torch.tensor([math.log(0.5), math.log(0.2), math.log(0.4)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25), math.log(0.6), math.log(0.4)], dtype=torch.float64)
    ln2, ln3 = math.log(2), math.log(3)
    expected = {
        "k1": [ln2, -ln3, 0.0],
        "k2": [0.5 * ln2**2, 0.5 * ln3**2, 0.0],
        "k3": [0.5 + ln2 - 1, 3 - ln3 - 1, 0.0],
    }
    for estimator, values in expected.items():
        got = token_kl(logp, ref, estimator)
        expected_t = torch.tensor(values, dtype=torch.float64)
        torch.testing.assert_close(got, expected_t, atol=1e-12, rtol=0)


def test_k3_is_never_negative():
    grid = torch.linspace(-20, 20, 201, dtype=torch.float64)
    logp, ref = torch.meshgrid(grid, grid, indexing="ij")
    assert (token_kl(logp, ref, "k3") >= 0).all()
    assert token_kl(logp, ref).shape == (201, 201)


def test_the_kl_weighted_by_the_ratio_has_k3_s_value_and_k1_s_gradient_on_policy():
    """algo.kl_ratio (TRL's use_bias_correction_kl): beta * k3 * r with r = 1. delta = logp - ref = 0.1, so
    rho = e^-0.1 = 0.904837, k3 = rho - 1 + 0.1 = 0.004837; the gradient is 1 - rho = 0.095163 unweighted and
    1 - rho + k3 = 0.1 weighted (k1's). A = 0: only the KL moves the token."""
    grads, values = {}, {}
    for weighted in (False, True):
        logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
        ref = torch.tensor([[-1.1]], dtype=torch.float64)
        zero = torch.zeros(1, dtype=torch.float64)
        x = flat_inputs(logp, logp.detach(), zero, torch.ones(1, 1), beta=1.0, ref_logp=ref, kl_ratio=weighted)
        loss, _ = policy_loss(x)
        loss.backward()
        values[weighted], grads[weighted] = loss.item(), logp.grad.item()
    assert values[False] == pytest.approx(0.004837418, abs=1e-9) and values[True] == pytest.approx(values[False])
    assert grads[False] == pytest.approx(0.0951625820, abs=1e-9)
    assert grads[True] == pytest.approx(0.1, abs=1e-12)


def test_unknown_kl_estimator_raises_value_error():
    with pytest.raises(ValueError, match="KL estimator"):
        token_kl(torch.zeros(2), torch.zeros(2), "k4")


# --------------------------------------------------------------------------------- policy_loss


def loop_policy_loss(
    logp, old_logp, adv, mask, clip_lo, clip_hi, beta, ref_logp, estimator, aggregation, ratio_level, max_len=None
):
    """Independent reference: python loops over sequences and tokens, scalar tensor arithmetic.

    Returns the loss (differentiable w.r.t. logp) and the clip counts and token count.
    """
    B, T = len(mask), len(mask[0])
    loss_sum = 0.0
    n_low = n_high = n_tok = 0
    total = 0.0
    for b in range(B):
        toks = [t for t in range(T) if mask[b][t]]
        A = adv[b]
        seq_log_ratio = 0.0
        for t in toks:
            seq_log_ratio = seq_log_ratio + (logp[b, t] - old_logp[b][t])
        if ratio_level == "sequence_mean" and toks:
            seq_log_ratio = seq_log_ratio / len(toks)
        seq_sum = 0.0
        for t in toks:
            if ratio_level == "token":
                r = torch.exp(logp[b, t] - old_logp[b][t])
            else:
                r = torch.exp(seq_log_ratio)
            clipped = max(1 - clip_lo, min(1 + clip_hi, r))
            L = -min(r * A, clipped * A)
            if beta > 0:
                d = ref_logp[b][t] - logp[b, t]
                if estimator == "k1":
                    kl = -d
                elif estimator == "k2":
                    kl = 0.5 * d * d
                else:
                    kl = torch.exp(d) - d - 1
                L = L + beta * kl
            seq_sum = seq_sum + L
            n_low += int(r.item() < 1 - clip_lo and A < 0)
            n_high += int(r.item() > 1 + clip_hi and A > 0)
        n_tok += len(toks)
        total = total + seq_sum
        if aggregation == "seq_mean_token_mean":
            loss_sum = loss_sum + (seq_sum / len(toks) if toks else 0.0)
        elif aggregation == "seq_mean_token_sum":
            loss_sum = loss_sum + seq_sum
    if aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        loss = loss_sum / B
    elif aggregation == "token_mean":
        loss = total / n_tok
    else:
        loss = total / (B * (max_len or T))
    return loss, n_low, n_high, n_tok


def make_batch(seed, B=5, T=7):
    """Random log-probs; old_logp far enough from logp that ratios clip on both sides."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    old_logp = logp + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref_logp = logp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    # A flat group's advantage, with ratios on both sides of the band: they count in neither
    # clip fraction.
    adv[-1] = 0.0
    signs = torch.tensor([(-1.0) ** t for t in range(T)], dtype=torch.float64)
    old_logp[-1] = logp[-1] + 0.5 * signs
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False  # a shorter completion
    mask[2, ::2] = False  # holes
    mask[3, :] = False  # an empty completion
    return logp, old_logp, ref_logp, adv, mask


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_policy_loss_and_gradient_match_a_loop_implementation(aggregation, ratio_level, estimator):
    clip_lo, clip_hi, beta = 0.2, 0.28, 0.04
    logp, old_logp, ref_logp, adv, mask = make_batch(seed=0)
    logp_a = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        flat_inputs(
            logp_a,
            old_logp,
            adv,
            mask,
            clip_eps=clip_lo,
            clip_eps_high=clip_hi,
            beta=beta,
            ref_logp=ref_logp,
            kl_estimator=estimator,
            aggregation=aggregation,
            ratio_level=ratio_level,
        )
    )
    loss.backward()

    logp_b = logp.clone().requires_grad_(True)
    ref_loss, n_low, n_high, n_tok = loop_policy_loss(
        logp_b,
        old_logp.tolist(),
        adv.tolist(),
        mask.tolist(),
        clip_lo,
        clip_hi,
        beta,
        ref_logp.tolist(),
        estimator,
        aggregation,
        ratio_level,
    )
    ref_loss.backward()

    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(logp_a.grad, logp_b.grad, atol=1e-12, rtol=1e-10)
    assert float(metrics["clip_frac_low"]) == pytest.approx(n_low / n_tok)
    assert float(metrics["clip_frac_high"]) == pytest.approx(n_high / n_tok)
    if ratio_level == "token":
        # The batch is built so that both clips fire; a test that never clips proves little.
        assert n_low > 0 and n_high > 0


def test_constant_norm_divides_by_the_given_max_completion_length():
    logp, old_logp, ref_logp, adv, mask = make_batch(seed=1)
    logp_a = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(
        flat_inputs(
            logp_a,
            old_logp,
            adv,
            mask,
            beta=0.1,
            ref_logp=ref_logp,
            aggregation="constant_norm",
            max_completion_length=11,
        )
    )
    loss.backward()
    logp_b = logp.clone().requires_grad_(True)
    ref_loss, *_ = loop_policy_loss(
        logp_b,
        old_logp.tolist(),
        adv.tolist(),
        mask.tolist(),
        0.2,
        0.2,
        0.1,
        ref_logp.tolist(),
        "k3",
        "constant_norm",
        "token",
        max_len=11,
    )
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(logp_a.grad, logp_b.grad, atol=1e-12, rtol=1e-10)


def test_metrics_report_masked_kl_and_ratio_statistics():
    # Two tokens kept, one padded with a value that would dominate any unmasked statistic.
    logp = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]], dtype=torch.float64)
    old = torch.tensor([[math.log(0.25), math.log(0.4), -30.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.6), 30.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    _, metrics = policy_loss(flat_inputs(logp, old, torch.tensor([1.0]), mask, beta=0.1, ref_logp=ref))
    k3 = [(0.5 + math.log(2) - 1), (3 - math.log(3) - 1)]
    assert set(metrics) == {"kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max"}
    # device tensors, read by the caller once per step (one host sync)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in metrics.values())
    metrics = floats(metrics)
    assert metrics["kl"] == pytest.approx(sum(k3) / 2)
    assert metrics["ratio_mean"] == pytest.approx((2.0 + 0.5) / 2)
    assert metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(2.0)
    # A > 0: the ratio 2.0 is clipped from above, the ratio 0.5 is not clipped from below.
    assert metrics["clip_frac_high"] == pytest.approx(0.5)
    assert metrics["clip_frac_low"] == 0.0


def test_kl_metric_is_zero_without_a_reference():
    _, metrics = policy_loss(flat_inputs(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3)))
    metrics = floats(metrics)
    assert metrics["kl"] == 0.0
    assert metrics["ratio_mean"] == metrics["ratio_min"] == metrics["ratio_max"] == 1.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_a_batch_without_completion_tokens_gives_zero_loss_and_neutral_metrics(aggregation):
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = policy_loss(
        flat_inputs(
            logp,
            torch.full((2, 3), -5.0),
            torch.tensor([1.0, -1.0]),
            torch.zeros(2, 3),
            beta=0.1,
            ref_logp=torch.full((2, 3), 5.0),
            aggregation=aggregation,
            ratio_level="sequence_mean",
        )
    )
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 3))
    assert floats(metrics) == {
        "kl": 0.0,
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.0,
        "ratio_mean": 1.0,
        "ratio_min": 1.0,
        "ratio_max": 1.0,
    }


@pytest.mark.parametrize(
    "ratio, adv, loss, grad",
    [
        (1.5, 1.0, -1.2, 0.0),  # A > 0, r above 1 + eps: clipped, no push further up
        (0.5, -1.0, 0.8, 0.0),  # A < 0, r below 1 - eps: clipped, no push further down
        (0.5, 1.0, -0.5, -0.5),  # A > 0, r below the band: unclipped, d(-r A)/dlogp = -r A
        (1.5, -1.0, 1.5, 1.5),  # A < 0, r above the band: unclipped
        (1.1, 1.0, -1.1, -1.1),  # inside the band
    ],
)
def test_clipping_stops_the_gradient_only_in_the_direction_the_advantage_pushes(ratio, adv, loss, grad):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    value, _ = policy_loss(flat_inputs(logp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1)))
    value.backward()
    assert value.item() == pytest.approx(loss)
    assert logp.grad.item() == pytest.approx(grad)


def test_constants_get_no_gradient_and_padding_garbage_does_not_leak():
    logp, old_logp, ref_logp, adv, mask = make_batch(seed=2)
    clean_logp = logp.clone().requires_grad_(True)
    clean, _ = policy_loss(
        flat_inputs(clean_logp, old_logp, adv, mask, beta=0.1, ref_logp=ref_logp, ratio_level="sequence")
    )
    clean.backward()

    dirty = lambda t, v: t.masked_fill(~mask, v)  # noqa: E731
    logp_d = dirty(logp, 1e4).requires_grad_(True)
    old_d = dirty(old_logp, -float("inf")).requires_grad_(True)
    ref_d = dirty(ref_logp, 1e4).requires_grad_(True)
    adv_d = adv.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        flat_inputs(logp_d, old_d, adv_d, mask.float(), beta=0.1, ref_logp=ref_d, ratio_level="sequence")
    )
    loss.backward()
    assert torch.equal(loss, clean)
    assert torch.equal(logp_d.grad, clean_logp.grad)
    assert (logp_d.grad[~mask] == 0).all()
    assert old_d.grad is None and ref_d.grad is None and adv_d.grad is None
    assert all(math.isfinite(v) for v in floats(metrics).values())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_micro_batches_with_the_batch_s_normalisers_add_up_to_the_full_batch(aggregation, ratio_level):
    """The same holds for ranks: each sees part of the batch, normalised by the whole batch's counts."""
    logp, old_logp, ref_logp, adv, mask = make_batch(seed=3, B=6)
    mask = mask.float()
    kwargs = dict(
        beta=0.05,
        ref_logp=ref_logp,
        aggregation=aggregation,
        ratio_level=ratio_level,
        clip_eps_high=0.3,
        max_completion_length=mask.shape[1],
    )
    full_logp = logp.clone().requires_grad_(True)
    full, _ = policy_loss(flat_inputs(full_logp, old_logp, adv, mask, **kwargs))
    full.backward()

    acc_logp = logp.clone().requires_grad_(True)
    total = 0.0
    for part in (slice(0, 2), slice(2, 5), slice(5, 6)):  # uneven, one holds the empty row
        kw = dict(kwargs, ref_logp=ref_logp[part], num_sequences=mask.shape[0], num_tokens=float(mask.sum()))
        micro, _ = policy_loss(flat_inputs(acc_logp[part], old_logp[part], adv[part], mask[part], **kw))
        micro.backward()
        total += micro.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(acc_logp.grad, full_logp.grad, atol=1e-12, rtol=1e-10)


def test_the_step_s_normalisers_are_what_each_aggregation_divides_by():
    # one sequence of 2 tokens, each with per-token loss -A = -1 (ratio 1, no KL): its token sum is -2
    logp, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]])
    call = lambda agg, **kw: float(
        policy_loss(
            flat_inputs(
                logp,
                logp,
                torch.ones(1),
                mask,
                aggregation=agg,  # noqa: E731
                max_completion_length=4,
                **kw,
            )
        )[0]
    )
    approx = lambda x: pytest.approx(x, rel=1e-6)  # noqa: E731  (float32)
    assert call("seq_mean_token_mean", num_sequences=8) == approx(-1 / 8)
    assert call("token_mean", num_tokens=10) == approx(-2 / 10)
    assert call("seq_mean_token_sum", num_sequences=8) == approx(-2 / 8)
    assert call("constant_norm", num_sequences=8) == approx(-2 / (8 * 4))
    assert call("seq_mean_token_mean") == -1 and call("token_mean") == -1 and call("constant_norm") == -2 / 4


def _call(**overrides):
    args = dict(
        logp=torch.zeros(6),
        old_logp=torch.zeros(6),
        advantages=torch.zeros(6),
        mask=torch.ones(6),
        segments=torch.arange(2).repeat_interleave(3),
    )
    args.update(overrides)
    return policy_loss(LossInputs(**args))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"aggregation": "mean"}, "aggregation"),
        ({"ratio_level": "sentence"}, "ratio level"),
        ({"kl_estimator": "k4"}, "KL estimator"),
        ({"beta": 0.1}, "ref_logp"),
        ({"logp": torch.zeros(2, 3)}, "1-D"),
        ({"old_logp": torch.zeros(4)}, "old_logp"),
        ({"mask": torch.ones(5)}, "mask"),
        ({"segments": torch.zeros(5, dtype=torch.long)}, "segments"),
        ({"ref_logp": torch.zeros(4)}, "ref_logp"),
        ({"advantages": torch.zeros(6, 1)}, "advantages"),
        ({"advantages": torch.zeros(3)}, "advantages"),
        ({"aggregation": "constant_norm", "max_completion_length": 0}, "max_completion_length"),
    ],
)
def test_bad_policy_loss_arguments_raise_value_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        _call(**overrides)


def test_rloo_advantages_are_the_leave_one_out_baseline_worked_by_hand():
    """algo.advantage=rloo: each score minus the mean of its group's other scores, unscaled; a no-score
    completion and a flat group get 0 (advantages.py). The numbers are worked by hand."""
    from types import SimpleNamespace

    from grpo_cli.algo.advantages import ADVANTAGES

    nan = float("nan")
    rewards = torch.tensor(
        [
            [1.0, 0.0, 0.0, 1.0],  # 1 - 1/3 = 2/3; 0 - 2/3 = -2/3
            [1.0, 0.0, 0.0, 0.0],  # 1 - 0 = 1; 0 - 1/3
            [nan, 1.0, 0.0, 1.0],  # over the three scores: 1 - 1/2; 0 - 1
            [1.0, 1.0, 1.0, 1.0],
        ],
        dtype=torch.float64,
    )  # flat: no signal
    got = ADVANTAGES["rloo"](rewards, SimpleNamespace())
    want = torch.tensor(
        [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [1, -1 / 3, -1 / 3, -1 / 3], [0, 0.5, -1, 0.5], [0, 0, 0, 0]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    algo = SimpleNamespace(scale="group", std="population", eps=0.0)
    torch.testing.assert_close(
        ADVANTAGES["grpo"](rewards[:2], algo),  # the default is the whitened advantage
        torch.tensor(
            [[1.0, -1, -1, 1], [1.732050807568877, -0.5773502691896258, -0.5773502691896258, -0.5773502691896258]],
            dtype=torch.float64,
        ),
        rtol=0,
        atol=1e-12,
    )
