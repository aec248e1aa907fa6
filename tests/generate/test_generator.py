"""The generator group without vLLM: the sampler-mismatch correction and metrics by hand, the weights a
vLLM engine is given (LoRA merged, the policy untouched), when it must be given them again, and the
one-sentence refusals. The engine itself is tested in tests/slow/test_vllm.py (make test-vllm)."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from grpo_cli.algo.objective import policy_loss, sampler_correction_weight
from grpo_cli.generate.vllm import fingerprint, full_weights
from grpo_cli.models.distributed import SINGLE
from grpo_cli.samples.metrics import StepMetrics
from grpo_cli.update.step import record_mismatch
from helpers import flat_inputs, forget_generator

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
    loss, _ = policy_loss(
        flat_inputs(
            logp,
            logp.detach(),
            torch.tensor([1.0]),
            torch.ones(1, 2),
            beta=0.5,
            ref_logp=ref,
            kl_estimator="k1",
            sampler_weight=weight,
        )
    )
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

    from grpo_cli.models.loading import load_model
    from grpo_cli.models.lora import add_adapter

    model = add_adapter(
        load_model(str(tiny_dir), device="cpu"),
        SimpleNamespace(r=r, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
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
    assert any(
        not torch.equal(pushed[n], before[n.replace("q_proj.", "q_proj.base_layer.")]) for n in pushed if "q_proj" in n
    )  # the adapter really is in the pushed weights
    assert all(torch.equal(p, before[n]) for n, p in model.get_base_model().named_parameters())
    with model.disable_adapter():  # the reference / a frozen base behaviour: the base weights
        plain = dict(full_weights(model))
    assert all(
        torch.equal(plain[n], before[n.replace(".weight", ".base_layer.weight")] if "q_proj" in n else plain[n])
        for n in plain
        if "q_proj" in n
    )


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
    for bad, words in (
        ("algo.sampler_correction=is", "algo.sampler_correction='is' must be one of none, tis"),
        ("algo.sampler_correction_cap=0.5", "algo.sampler_correction_cap=0.5 must be >= 1"),
        ("generator.name=sglang", "generator.name='sglang' must be one of hf, vllm"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "grpo_cli.cli", "train", bad], capture_output=True, text=True, env=env
        )
        assert out.returncode == 2 and words in out.stderr + out.stdout and "Traceback" not in out.stderr, out.stderr


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the refusal is for an environment without it")
@pytest.mark.parametrize(
    "command", [["train", "trainer.steps=1"], ["evaluate", "samples=0", "limit=2"], ["sample", "prompt='1+1='"]]
)
def test_generator_vllm_without_vllm_is_one_sentence(command, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "grpo_cli.cli", *command, "generator=vllm", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert "generator=vllm needs vLLM" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_registered_back_end_checks_its_own_settings_and_names_what_it_needs():
    """A back-end declares its rules and its library (generators.Backend); checks.py applies them with the
    rest of the config, and `check_available` names the missing library, without importing the factory."""
    from dataclasses import dataclass

    from grpo_cli.config import GeneratorConfig, TrainConfig, VLLMGeneratorConfig, check
    from grpo_cli.config.declare import setting
    from grpo_cli.errors import GrpoError
    from grpo_cli.generate.base import check_available, register_generator

    @dataclass
    class ToySettings(GeneratorConfig):
        kv_cache_gib: float = setting(
            1.0,
            "what toy serves",
            check=lambda v: None if v <= 2 else f"generator.kv_cache_gib={v} is more than toy serves (2)",
        )

    register_generator(
        "toy",
        "no_such_module:Toy",
        settings=ToySettings,
        requires="no_such_module_xyz",
        install="generator=toy needs no_such_module_xyz: pip install it.",
    )
    try:
        cfg = TrainConfig()
        cfg.generator = ToySettings(name="toy", kv_cache_gib=3.0)
        with pytest.raises(GrpoError, match=r"generator.kv_cache_gib=3.0 is more than toy serves \(2\)"):
            check(cfg)
        cfg.generator.kv_cache_gib = 1.0
        check(cfg)  # within its rules: the rest of the default config is fine
        with pytest.raises(GrpoError, match=r"^generator=toy needs no_such_module_xyz: pip install it.$"):
            check_available(cfg.generator)
        check_available(GeneratorConfig(name="hf"))  # hf needs nothing beyond torch and transformers
    finally:
        forget_generator("toy")
    cfg = TrainConfig()  # vLLM's own rules are declared the same way, and read without vLLM installed
    cfg.generator, cfg.model.lora.quantize = VLLMGeneratorConfig(gpu_memory_utilization=1.5), "nf4"
    with pytest.raises(
        GrpoError,
        match=r"generator.gpu_memory_utilization=1.5 must be .*generator=vllm cannot serve "
        r"a 4-bit QLoRA base",
    ):
        check(cfg)


def skip_where_bf16_is_slow() -> None:
    from grpo_cli.models.precision import decode_ratio

    ratio = decode_ratio(torch.device("cpu"))
    if ratio > 1.0:
        pytest.skip(
            f"bf16 is {ratio:.1f}x slower than fp32 on this CPU, so generator.weights=bf16 is refused here "
            "(test_bf16_sampling_where_bf16_is_slow_is_one_sentence covers that)"
        )


def test_bf16_sampling_weights_sample_the_training_rollouts_and_leave_held_out_scoring_as_trained(tiny_dir):
    """generator.weights=bf16: the rollouts the update trains on (log-probs asked) come from bf16 autocast and carry
    the sampler's log-probs, within 0.05 nats a token of the fp32 model's log-probs of the same tokens (computed
    here independently, by a plain forward); held-out scoring (no log-probs asked) reads the model as trained, so
    its greedy completions equal generator.weights=full's."""
    from grpo_cli.config import HFGeneratorConfig, SamplerConfig
    from grpo_cli.generate.hf import HFGenerator
    from grpo_cli.models.loading import load_model, load_tokenizer

    skip_where_bf16_is_slow()
    model, tok = load_model(str(tiny_dir), device="cpu"), load_tokenizer(str(tiny_dir))
    prompts = ["12+7=", "30+45=", "8+9="]
    bf16 = HFGenerator(tok, HFGeneratorConfig(weights="bf16"), device="cpu")
    full = HFGenerator(tok, HFGeneratorConfig(), device="cpu")
    assert bf16.returns_logprobs and not full.returns_logprobs

    def gaps(generator) -> torch.Tensor:  # |sampler log-prob - the fp32 model's|, each sampled token
        roll = generator.generate(model, prompts, 4, SamplerConfig(6, temperature=1.0), [1, 2, 3], with_logprobs=True)
        out = []
        for start, length in zip(roll.offsets.tolist(), roll.lengths.tolist()):
            row, end = roll.tokens[start : start + length], start + length
            with torch.no_grad():
                logp = torch.log_softmax(model(row[None]).logits[0].float(), -1)[:-1].gather(-1, row[1:, None])[:, 0]
            on = roll.loss_mask[start + 1 : end].bool()
            out.append((logp[on] - roll.sampler_logp[start + 1 : end][on]).abs())
        return torch.cat(out)

    in_bf16, in_fp32 = gaps(bf16), gaps(full)
    assert len(in_bf16) >= 12 and in_fp32.max() < 1e-4  # the check itself: fp32 sampling matches to rounding
    assert 1e-4 < in_bf16.mean() < 0.05, in_bf16.mean()  # bf16 differs from fp32, a little
    greedy = SamplerConfig(6, temperature=0)
    assert bf16.generate(model, prompts, 1, greedy).completions == full.generate(model, prompts, 1, greedy).completions


def test_bf16_sampling_where_bf16_is_slow_is_one_sentence(monkeypatch, tiny_dir):
    from grpo_cli.config import HFGeneratorConfig
    from grpo_cli.errors import GrpoError
    from grpo_cli.generate import hf as generation
    from grpo_cli.models.loading import load_tokenizer

    monkeypatch.setattr(generation, "decode_ratio", lambda device: 38.5)  # an AVX2 CPU emulating bf16
    with pytest.raises(
        GrpoError,
        match=r"generator.weights=bf16 would sample slower than fp32 on this cpu "
        r"\(a decode-shaped bf16 product took 38.5x fp32's time\); set generator.weights=full",
    ):
        generation.HFGenerator(load_tokenizer(str(tiny_dir)), HFGeneratorConfig(weights="bf16"), device="cpu")


def test_a_run_with_bf16_sampling_weights_logs_the_gap_and_corrects_it(tmp_path, capsys):
    """Three steps of the default task with generator.weights=bf16 and the truncated importance correction: every
    training row carries the measured gap (small, not zero) and the share of capped tokens."""
    from helpers import grpo, metric_rows

    skip_where_bf16_is_slow()
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path}",
            "trainer.steps=3",
            "trainer.prompts_per_step=8",
            "trainer.eval_before_after=false",
            "generator.weights=bf16",
            "algo.sampler_correction=tis",
        )
        == 0
    )
    rows = metric_rows(tmp_path, training=True)
    assert len(rows) == 3
    assert all(0 < r["sampler/logp_diff"] < 0.05 for r in rows), [r["sampler/logp_diff"] for r in rows]
    assert all("sampler/capped_frac" in r for r in rows), sorted(rows[0])
