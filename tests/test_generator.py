"""The generator group without vLLM: the sampler-mismatch correction and metrics by hand, the weights a
vLLM engine is given (LoRA merged, the policy untouched), when it must be given them again, and the
one-sentence refusals. The engine itself is tested in tests/test_vllm.py (make test-vllm)."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from grpo_cli.models.distributed import SINGLE
from grpo_cli.update.metrics import StepMetrics
from grpo_cli.algo.objective import LossInputs, policy_loss, sampler_correction_weight
from grpo_cli.update.step import record_mismatch
from grpo_cli.rollout.vllm_engine import fingerprint, full_weights

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_the_truncated_importance_weight_is_min_of_the_ratio_and_the_cap():
    old = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.3)]])
    w = sampler_correction_weight(old, sampler, cap=2.5)
    # 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.3 = 3 capped at 2.5
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.5]]))


def test_the_weight_scales_the_surrogate_and_not_the_kl():
    # On-policy (ratio 1), one sequence of two tokens, A = 1, k1 KL with ref log-ratio 0.1 per token.
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = logp.detach() - 0.1
    weight = torch.tensor([[2.0, 0.5]])
    loss, _ = policy_loss(LossInputs(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), beta=0.5, ref_logp=ref,
                          kl_estimator="k1", sampler_weight=weight))
    # per token: -w_t * 1 + 0.5 * 0.1; mean over the two tokens: (-2 + 0.05 - 0.5 + 0.05) / 2 = -1.2
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    loss.backward()  # d/dlogp_t of -w_t * exp(logp_t - old_t) at ratio 1 is -w_t, plus beta * 1 (k1), over 2 tokens
    assert torch.allclose(logp.grad, torch.tensor([[(-2.0 + 0.5) / 2, (-0.5 + 0.5) / 2]]))


def test_mismatch_metrics_by_hand():
    old = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.4), -5.0]])  # the third token is padding
    mask = torch.tensor([[1, 1, 0]])
    record = StepMetrics()
    record_mismatch(record, old, sampler, mask, sampler_correction_weight(old, sampler, 1.5), cap=1.5)
    row = record.reduce(SINGLE)
    assert row["sampler/logp_diff"] == pytest.approx((math.log(2) + math.log(2)) / 2)
    assert row["sampler/ratio_max"] == pytest.approx(2.0)
    assert row["sampler/capped_frac"] == pytest.approx(0.5)  # 2 > 1.5; 0.5 is not


def _lora(tiny_dir, r=4):
    from types import SimpleNamespace

    from grpo_cli.models.lora import add_adapter
    from grpo_cli.models.loading import load_model

    model = add_adapter(load_model(str(tiny_dir), device="cpu"), SimpleNamespace(
        r=r, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # a trained-looking adapter: B is zero at init
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    return model


def test_full_weights_of_a_lora_policy_equal_peft_s_merge_and_leave_the_policy_untouched(tiny_dir):
    pytest.importorskip("peft", reason="peft is not installed (the peft extra)")
    model = _lora(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.get_base_model().named_parameters()}  # checkpoint names
    pushed = dict(full_weights(model))
    twin = _lora(tiny_dir)
    twin.load_state_dict(model.state_dict())  # lora_A is random at init: copy it too
    merged = twin.merge_and_unload()  # peft's own merge, of an identical adapter
    expected = dict(merged.named_parameters())
    assert set(pushed) == set(expected)
    for name, tensor in expected.items():
        assert torch.allclose(pushed[name], tensor, atol=1e-6), name
    assert any(not torch.equal(pushed[n], before[n.replace("q_proj.", "q_proj.base_layer.")])
               for n in pushed if "q_proj" in n)  # the adapter really is in the pushed weights
    assert all(torch.equal(p, before[n]) for n, p in model.get_base_model().named_parameters())
    with model.disable_adapter():  # the reference / a frozen base behaviour: the base weights
        plain = dict(full_weights(model))
    assert all(torch.equal(plain[n], before[n.replace(".weight", ".base_layer.weight")] if "q_proj" in n else plain[n])
               for n in plain if "q_proj" in n)


def test_the_fingerprint_changes_exactly_when_the_sampling_weights_do(tiny_dir):
    pytest.importorskip("peft", reason="peft is not installed (the peft extra)")
    from grpo_cli.models.lora import AdapterCopy

    model = _lora(tiny_dir)
    first = fingerprint(model)
    assert fingerprint(model) == first
    with torch.no_grad():
        list(model.parameters())  # reading changes nothing
    assert fingerprint(model) == first
    lagged = AdapterCopy(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sum(p.sum() for p in model.parameters() if p.requires_grad).backward()
    opt.step()
    stepped = fingerprint(model)
    assert stepped != first
    with model.disable_adapter():
        assert fingerprint(model) != stepped  # the adapter off: other weights, same tensors
    with lagged.swapped_in(model):
        assert fingerprint(model) != stepped  # a lagged adapter swapped in


def test_sampler_correction_and_generator_values_are_checked():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for bad, words in (("algo.sampler_correction=is", "algo.sampler_correction='is' must be one of none, tis"),
                       ("algo.sampler_correction_cap=0.5", "algo.sampler_correction_cap=0.5 must be >= 1"),
                       ("generator.name=sglang", "generator.name='sglang' must be one of hf, vllm")):
        out = subprocess.run([sys.executable, "-m", "grpo_cli.cli", "train", bad], capture_output=True, text=True, env=env)
        assert out.returncode == 2 and words in out.stderr + out.stdout and "Traceback" not in out.stderr, out.stderr


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the refusal is for an environment without it")
@pytest.mark.parametrize("command", [["train", "trainer.steps=1"], ["evaluate", "samples=0", "limit=2"],
                                     ["sample", "prompt='1+1='"]])
def test_generator_vllm_without_vllm_is_one_sentence(command, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "grpo_cli.cli", *command, "generator=vllm", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "generator=vllm needs vLLM" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_registered_back_end_checks_its_own_settings_and_names_what_it_needs():
    """A back-end declares its rules and its library (generators.Backend); checks.py applies them with the
    rest of the config, and `check_available` names the missing library, without importing the factory."""
    from grpo_cli.config import TrainConfig
    from grpo_cli.errors import GrpoError
    from grpo_cli.rollout.generators import GENERATORS, check_available, register_generator
    from grpo_cli.run.checks import check_train

    def check(p, g, model):
        p.need(g.kv_cache_gib <= 2, f"generator.kv_cache_gib={g.kv_cache_gib} is more than toy serves (2)")

    register_generator("toy", "no_such_module:Toy", check=check, requires="no_such_module_xyz",
                       install="generator=toy needs no_such_module_xyz: pip install it.")
    try:
        cfg = TrainConfig()
        cfg.generator.name, cfg.generator.kv_cache_gib = "toy", 3.0
        with pytest.raises(GrpoError, match=r"generator.kv_cache_gib=3.0 is more than toy serves \(2\)"):
            check_train(cfg)
        cfg.generator.kv_cache_gib = 1.0
        check_train(cfg)  # within its rules: the rest of the default config is fine
        with pytest.raises(GrpoError, match=r"^generator=toy needs no_such_module_xyz: pip install it.$"):
            check_available(cfg.generator)
        cfg.generator.name = "hf"
        check_available(cfg.generator)  # hf needs nothing beyond torch and transformers
    finally:
        GENERATORS.pop("toy")
    cfg = TrainConfig()  # vLLM's own rules are declared the same way, and read without vLLM installed
    cfg.generator.name, cfg.generator.gpu_memory_utilization, cfg.model.lora.quantize = "vllm", 1.5, "nf4"
    with pytest.raises(GrpoError, match=r"generator.gpu_memory_utilization=1.5 must be .*generator=vllm cannot serve "
                                        r"a 4-bit QLoRA base"):
        check_train(cfg)
