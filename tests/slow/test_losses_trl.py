"""Agreement with TRL 1.16's own loss code (`GRPOTrainer._compute_loss`, run on given log-probs and
entropies through a stand-in trainer): loss value and gradients, float64, to 1e-10 relative (SAPO with
tau_neg = 1.05: 1e-6, TRL's temperatures are float32).

TRL has CISPO, SAPO, dual-clip (its `delta`: the ratio capped at delta in the surrogate, which equals
verl's dual-clip bound c whenever c > 1 + eps_high) and the entropy bonus. Where the formulas differ, the
difference is asserted: TRL's entropy bonus is each micro-batch's own token mean, grpo-cli's the step's
(they agree on one micro-batch). `make test-trl` installs TRL and runs this file.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from helpers import flat_inputs

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is not installed (make test-trl installs it)")

from grpo_cli.algo.objective import policy_loss  # noqa: E402

pytestmark = pytest.mark.trl

B, T = 6, 5


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 1.6  # ratios from 0.45 to 2.2
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, 3:] = 0  # completions of different lengths
    mask[2, 1:] = 0
    return logp, old, entropy, adv, mask


def trl_loss(
    loss_type,
    logp,
    old,
    entropy,
    adv,
    mask,
    *,
    eps_low=0.2,
    eps_high=0.2,
    delta=None,
    entropy_coef=0.0,
    sapo=(1.0, 1.05),
    level="token",
    beta=0.0,
    kl_correction=False,
    ref=None,
):
    """TRL's `_compute_loss` with the trainer around it stood in for: one process, no accumulation."""
    args = SimpleNamespace(
        delta=delta,
        sapo_temperature_pos=sapo[0],
        sapo_temperature_neg=sapo[1],
        use_bias_correction_kl=kl_correction,
        steps_per_generation=1,
        entropy_target=0.0,
    )
    accelerator = SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, entropy, None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=args,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accelerator,
        _entropy_bonus_enabled=entropy_coef != 0,
        entropy_coef=entropy_coef,
        use_adaptive_entropy=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        max_completion_length=T,
    )
    n = logp.shape[0]
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return trl_grpo.GRPOTrainer._compute_loss(stand_in, None, inputs)


# (TRL's settings, grpo-cli's policy_loss settings) for the same formula
CASES = {
    "grpo": (dict(loss_type="grpo"), dict()),
    "dapo_clip_higher": (dict(loss_type="dapo", eps_high=0.28), dict(clip_eps_high=0.28, aggregation="token_mean")),
    "dr_grpo": (dict(loss_type="dr_grpo"), dict(aggregation="constant_norm", max_completion_length=T)),
    "dual_clip": (dict(loss_type="grpo", delta=1.5), dict(clip_ratio_c=1.5)),
    "cispo": (
        dict(loss_type="cispo", eps_high=1.3),
        dict(loss="cispo", loss_args={"ratio_max": 1.3}, aggregation="token_mean"),
    ),
    "sapo": (dict(loss_type="sapo", sapo=(1.0, 1.05)), dict(loss="sapo", loss_args={"tau_pos": 1.0, "tau_neg": 1.05})),
    "sapo_gspo": (
        dict(loss_type="sapo", sapo=(0.5, 2.0), level="sequence"),
        dict(loss="sapo", loss_args={"tau_pos": 0.5, "tau_neg": 2.0}, ratio_level="sequence_mean"),
    ),
    "grpo_entropy_bonus": (dict(loss_type="grpo", entropy_coef=0.05), dict(entropy_coef=0.05)),
    "grpo_kl": (dict(loss_type="grpo", beta=0.04), dict(beta=0.04, kl_estimator="k3")),
    "dapo_kl_times_ratio": (
        dict(loss_type="dapo", beta=0.04, kl_correction=True),
        dict(beta=0.04, kl_estimator="k3", kl_ratio=True, aggregation="token_mean"),
    ),
    "cispo_entropy_bonus": (
        dict(loss_type="cispo", eps_high=1.3, entropy_coef=0.2),
        dict(loss="cispo", loss_args={"ratio_max": 1.3}, aggregation="token_mean", entropy_coef=0.2),
    ),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_agree_with_trl(case, seed):
    trl_kw, ours_kw = CASES[case]
    logp, old, entropy, adv, mask = _batch(seed)
    if trl_kw.get("beta"):  # a reference up to 0.5 nats from the old policy either way
        ref = old + (torch.rand(B, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.5)
        trl_kw, ours_kw = {**trl_kw, "ref": ref}, {**ours_kw, "ref_logp": ref}
    a_logp, a_ent = logp.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    theirs = trl_loss(logp=a_logp, old=old, entropy=a_ent, adv=adv, mask=mask, **trl_kw)
    theirs.backward()
    b_logp, b_ent = logp.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    ours, _ = policy_loss(flat_inputs(b_logp, old, adv, mask, entropy=b_ent, **{"beta": 0.0, **ours_kw}))
    ours.backward()
    # TRL builds SAPO's temperatures with torch.where from Python floats, a float32 tensor: 1.05 is
    # 1.0499999523 there, which moves the result by ~4e-8 relative. Every other case agrees to 1e-10.
    rel = 1e-6 if case == "sapo" else 1e-10
    assert ours.item() == pytest.approx(theirs.item(), rel=rel, abs=1e-12)
    assert torch.allclose(b_logp.grad, a_logp.grad, rtol=rel, atol=1e-12)
    if ours_kw.get("entropy_coef"):
        assert torch.allclose(b_ent.grad, a_ent.grad, rtol=rel, atol=1e-12)


def test_entropy_bonus_is_the_steps_token_mean_where_trl_takes_each_micro_batchs():
    """Two micro-batches of unequal token counts: grpo-cli's accumulated bonus is the whole step's token
    mean (global normaliser), TRL's the average of the micro-batches' own means."""
    logp, old, entropy, adv, mask = _batch(0)
    zero_adv = torch.zeros_like(adv)  # the bonus alone
    halves = (slice(0, 3), slice(3, 6))
    tokens = mask.sum().item()
    ours = sum(
        policy_loss(
            flat_inputs(
                logp[h],
                old[h],
                zero_adv[h],
                mask[h],
                entropy=entropy[h],
                entropy_coef=1.0,
                num_tokens=tokens,
                num_sequences=B,
            )
        )[0]
        for h in halves
    )
    step_mean = (entropy * mask).sum() / mask.sum()
    assert ours.item() == pytest.approx(-step_mean.item(), rel=1e-12)
    theirs = (
        sum(trl_loss("grpo", logp[h], old[h], entropy[h], zero_adv[h], mask[h], entropy_coef=1.0) for h in halves) / 2
    )
    micro_means = sum((entropy[h] * mask[h]).sum() / mask[h].sum() for h in halves) / 2
    assert theirs.item() == pytest.approx(-micro_means.item(), rel=1e-12)
    assert abs(theirs.item() - ours.item()) > 1e-3  # the two normalisations really differ here


def test_algo_trl_is_the_default_trl_s_grpo_config_documents():
    """`algo=trl` composed, each value against TRL 1.16's own GRPOConfig field defaults (and, for sigma, the
    constant its trainer adds to the std)."""
    import dataclasses
    import inspect

    from trl import GRPOConfig

    from grpo_cli.commands.compose import compose_config

    trl = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING}
    cfg = compose_config("train", ["algo=trl"])
    a, s = cfg.algo, cfg.sampler
    aggregation = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "dr_grpo": "constant_norm"}
    assert a.beta == trl["beta"] == 0.0
    assert a.aggregation == aggregation[trl["loss_type"]] and a.loss == "clip"
    assert a.clip_eps == trl["epsilon"]
    assert a.clip_eps_high == trl["epsilon_high"] is None and a.clip_ratio_c == trl["delta"] is None
    assert a.kl_estimator == "k3" and a.kl_ratio == trl["use_bias_correction_kl"] is True
    assert a.scale == trl["scale_rewards"] == "group"
    trainer_source = inspect.getsource(trl_grpo.GRPOTrainer)
    assert "std_rewards + 1e-4" in trainer_source and a.std == "sample" and a.eps == 1e-4
    from trl.trainer.utils import nanstd

    from grpo_cli.algo.objective import group_advantages

    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.4, 0.4, 0.1, 0.3, 0.8, 0.5]])
    theirs = (rewards - rewards.mean(1, keepdim=True)) / (nanstd(rewards, dim=1)[:, None] + 1e-4)
    ours = group_advantages(rewards, scale=a.scale, std=a.std, eps=a.eps)
    assert torch.allclose(ours, theirs, rtol=5e-4, atol=0), (ours - theirs).abs().max()  # sigma within 1e-4
    assert a.ratio_level == trl["importance_sampling_level"] == "token"
    assert a.num_iterations == trl["num_iterations"]
    assert (s.temperature, s.top_p, s.top_k, s.group_size) == (
        trl["temperature"], trl["top_p"], trl["top_k"], trl["num_generations"]
    )  # fmt: skip
