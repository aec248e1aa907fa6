"""LoRA through peft: only the adapter trains, the reference is the base with the adapter off, resume
is exact, and the outputs load as a merged model and as an adapter."""

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpo_cli.cli import main
from grpo_cli.config import LoraConfig, SamplerConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.models.forward import score
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.models.lora import AdapterCopy, adapter_disabled, adapter_state, add_adapter
from grpo_cli.models.policies import BASE, Policies, load_policy
from grpo_cli.models.precision import Precision
from grpo_cli.run.console import Console
from grpo_cli.run.trainer import train
from grpo_cli.samples.settings import StepSettings
from helpers import SMALL, SMALL_DATA, generate, grpo, metric_rows, padded, token_logprobs

TINY = [*SMALL, *SMALL_DATA, "trainer.micro_batch_size=8", "model.lora.r=8", "optimizer.lr=2e-3"]


def run(*args) -> int:
    return grpo("train", *TINY, *args)


def lora_cfg(**algo) -> TrainConfig:
    cfg = TrainConfig()
    cfg.model.lora = LoraConfig(r=8)
    cfg.sampler.group_size, cfg.trainer.micro_batch_size = 4, 8
    for k, v in algo.items():
        setattr(cfg.algo, k, v)
    return cfg


def nudge_adapter(model, scale=0.05) -> None:
    """Non-zero adapter weights (a fresh adapter's B is zero, so it would equal the base)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * scale)


def test_only_the_adapter_receives_gradients():
    policy = load_policy(lora_cfg().model, Precision("fp32"))
    tok = load_tokenizer("builtin:tiny")
    roll = generate(policy, tok, ["1+2=", "3+4="], 2, max_new_tokens=3, seeds=[0, 1])
    policy.train()
    logp, _ = token_logprobs(policy, padded(roll)[0], padded(roll)[1], roll.completion_len)
    (logp * padded(roll)[2]).sum().backward()
    named = dict(policy.named_parameters())
    adapter = {n for n, p in named.items() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    assert all(p.grad is not None for n, p in named.items() if n in adapter)
    assert all(p.grad is None for n, p in named.items() if n not in adapter)  # the base never gets one


def test_the_reference_under_lora_is_the_base_model_even_after_the_adapter_has_moved():
    cfg = lora_cfg(beta=0.04)
    policy = load_policy(cfg.model, Precision("fp32"))
    nudge_adapter(policy)
    base = load_model("builtin:tiny", torch.float32, "cpu")
    tok = load_tokenizer("builtin:tiny")
    roll = generate(base, tok, ["1+2=", "13+4=", "5+25="], 3, max_new_tokens=4, seeds=[0, 1, 2])
    policies = Policies.load(cfg, Precision("fp32"), policy)
    assert policies.held_reference == BASE  # no second model is loaded: the policy with its adapter off
    with policies.reference() as reference:
        got = score(reference, roll, 1.0, StepSettings.of(cfg), Precision("fp32"))
    want = score(base, roll, 1.0, StepSettings.of(cfg), Precision("fp32"))
    moved = score(policy, roll, 1.0, StepSettings.of(cfg), Precision("fp32"))
    m = roll.loss_mask.bool()
    assert torch.allclose(got[m], want[m], atol=1e-6)
    assert not torch.allclose(moved[m], want[m], atol=1e-3)  # with the adapter on, the policy differs


def test_a_lagged_behaviour_under_lora_is_a_copy_of_the_adapter_swapped_in_and_out_bit_for_bit():
    cfg = lora_cfg(behaviour="lagged", behaviour_refresh=2)
    policy = load_policy(cfg.model, Precision("fp32"))
    policies = Policies.load(cfg, Precision("fp32"), policy)
    assert isinstance(policies.held_behaviour, AdapterCopy)
    lagged = adapter_state(policy)
    nudge_adapter(policy)
    own = adapter_state(policy)
    with policies.behaviour() as sampler:
        assert all(torch.equal(p, lagged[n]) for n, p in adapter_state(sampler).items())
    assert all(torch.equal(p, own[n]) for n, p in adapter_state(policy).items())  # restored exactly
    policies.refresh(1)
    assert all(torch.equal(v, lagged[n]) for n, v in policies.held_behaviour.state.items())  # not yet: every 2 steps
    policies.refresh(2)
    assert all(torch.equal(v, own[n]) for n, v in policies.held_behaviour.state.items())


def test_a_lora_run_s_reward_rises_on_the_default_task(tmp_path):
    assert (
        run(
            f"output_dir={tmp_path}",
            "trainer.steps=40",
            "trainer.prompts_per_step=16",
            "sampler.group_size=8",
            "data.max_operand=49",
            "data.num_test=200",
            "trainer.micro_batch_size=128",
        )
        == 0
    )
    rewards = [json.loads(line)["reward_mean"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, (first, last)


def test_lora_resume_is_bitwise_exact(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = ["algo.beta=0.04", "algo.num_iterations=2"]  # the reference (adapter off) and old log-probs in play
    assert run(f"output_dir={straight}", "trainer.steps=4", *extra) == 0
    assert run(f"output_dir={resumed}", "trainer.steps=2", *extra) == 0
    assert run(f"output_dir={resumed}", "trainer.steps=4", "resume=auto", *extra) == 0
    for name in ("final/adapter/adapter_model.safetensors", "final/model.safetensors"):
        a, b = load_file(straight / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    rows = lambda d: metric_rows(d, timing=False)  # noqa: E731
    assert rows(straight) == rows(resumed)


def test_final_is_a_merged_model_with_the_same_greedy_completions_and_final_adapter_loads_with_peft(tmp_path):
    assert run(f"output_dir={tmp_path}", "trainer.steps=3") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(load_tokenizer("builtin:tiny").name_or_path)
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "final" / "adapter")
    tok = load_tokenizer(str(tmp_path / "final"))
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(0, 10, 3)]
    greedy = SamplerConfig(6, temperature=0)
    from grpo_cli.models.logprobs import enable_logprob_forward

    enable_logprob_forward(merged)
    a = HFGenerator(tok).generate(merged, prompts, 1, greedy).completions
    b = HFGenerator(tok).generate(with_adapter, prompts, 1, greedy).completions
    assert a == b
    adapter = load_file(tmp_path / "final" / "adapter" / "adapter_model.safetensors")
    assert adapter and any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # it trained


def test_evaluate_and_sample_accept_an_adapter_directory(tmp_path):
    assert run(f"output_dir={tmp_path / 'run'}", "trainer.steps=2", "trainer.save_every=1") == 0
    with pytest.raises(SystemExit) as e:
        main(
            [
                "evaluate",
                f"checkpoint=[{tmp_path / 'run' / 'final' / 'adapter'},{tmp_path / 'run'}]",
                "data.max_operand=9",
                "data.num_test=20",
                "samples=0",
                f"output_dir={tmp_path / 'eval'}",
            ]
        )
        raise SystemExit(0)
    assert e.value.code in (0, None)
    rows = json.loads((tmp_path / "eval" / "eval.json").read_text())["rows"]
    names = [r["checkpoint"] for r in rows]
    assert names[0].endswith("adapter") and names[1].endswith("step-1") and names[-1].endswith("final")
    assert rows[0]["accuracy"] == rows[-1]["accuracy"]  # the adapter and the merged final/ are the same model
    with pytest.raises(SystemExit) as e:
        main(
            [
                "sample",
                f"checkpoint={tmp_path / 'run' / 'checkpoints' / 'step-2'}",
                "prompt='3+4='",
                "sampler.group_size=2",
                f"output={tmp_path / 's.jsonl'}",
            ]
        )
        raise SystemExit(0)
    assert e.value.code in (0, None) and len((tmp_path / "s.jsonl").read_text().splitlines()) == 2


def test_lora_with_bf16_mixed_and_gradient_checkpointing_trains_a_float32_adapter_on_a_bf16_base(tmp_path):
    assert (
        run(
            f"output_dir={tmp_path}",
            "trainer.steps=2",
            "trainer.precision=bf16-mixed",
            "model.gradient_checkpointing=true",
            "algo.beta=0.04",
        )
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["skipped"] == 0.0 and r["kl"] >= 0 for r in rows)
    cfg = lora_cfg()
    cfg.model.gradient_checkpointing = True
    policy = load_policy(cfg.model, Precision("bf16-mixed"))
    dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}


def test_ref_refresh_under_lora_and_qlora_on_cpu_are_refused_with_one_sentence(tmp_path):
    from grpo_cli.config import check as check_config

    cfg = lora_cfg(ref_refresh=10)
    with pytest.raises(GrpoError, match="algo.ref_refresh copies the policy into a second model"):
        check_config(cfg)
    cfg = lora_cfg()
    cfg.model.lora.quantize = "4bit"
    cfg.model.device = "cpu"
    with pytest.raises(GrpoError, match=r"^model.lora.quantize=4bit \(QLoRA\) needs a CUDA GPU"):
        train(cfg, tmp_path, Console(progress=False))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="QLoRA needs a CUDA GPU (bitsandbytes' 4-bit kernels); none here"
)
def test_qlora_trains_a_float32_adapter_on_a_4bit_base(tmp_path):
    assert (
        run(
            f"output_dir={tmp_path}",
            "trainer.steps=2",
            "model.lora.quantize=4bit",
            "model.device=cuda",
            "trainer.precision=bf16-mixed",
        )
        == 0
    )
    assert (tmp_path / "final" / "adapter" / "adapter_model.safetensors").exists()


def test_an_unknown_target_module_is_one_sentence_naming_all_linear():
    base = load_model("builtin:tiny", torch.float32, "cpu")
    with pytest.raises(
        GrpoError, match="set model.lora.target_modules to module names of this model, or to all-linear"
    ):
        add_adapter(base, LoraConfig(r=4, target_modules=["no_such_layer"]))
    assert add_adapter(load_model("builtin:tiny", torch.float32, "cpu"), LoraConfig(r=4, target_modules="all-linear"))


def test_adapter_disabled_context_restores_the_adapter():
    policy = load_policy(lora_cfg().model, Precision("fp32"))
    nudge_adapter(policy)
    ids = torch.tensor([[5, 6, 7]])
    on = policy(input_ids=ids).logits
    with adapter_disabled(policy):
        off = policy(input_ids=ids).logits
    assert not torch.allclose(on, off) and torch.equal(policy(input_ids=ids).logits, on)
