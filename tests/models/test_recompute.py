"""Pointwise recompute (grpo_cli/models/recompute.py): the same gradients, bit for bit, with less kept."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_cli.models import recompute
from grpo_cli.models.memory import Shape, activation_bytes_per_token


def llama(hidden=64, intermediate=176, layers=2, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).float()


def grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradients_are_bitwise_those_without_it():
    plain = llama()
    lean = copy.deepcopy(plain)
    assert recompute.recompute_pointwise(lean, "true") == 2 * 3  # each layer's MLP and two norms
    ids = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    loss0, g0 = grads(plain, ids, ids)
    loss1, g1 = grads(lean, ids, ids)
    assert torch.equal(loss0, loss1)
    assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0), [
        n for n in g0 if not torch.equal(g0[n], g1[n])
    ]


def test_a_deep_copy_computes_with_its_own_weights():
    """The wrapper is a method bound to its module, so a copy (a reference model) never runs the original's weights."""
    model = llama()
    recompute.recompute_pointwise(model, "true")
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(0.5)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    x = torch.randn(2, 12, 64, requires_grad=True)
    for layer_a, layer_b in zip(model.model.layers, copied.model.layers):
        assert not torch.equal(layer_a.mlp(x), layer_b.mlp(x))  # under autograd: the checkpointed path
        with torch.no_grad():
            assert torch.equal(layer_b.mlp(x), type(layer_b.mlp).forward(layer_b.mlp, x))
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, copied(ids).logits)


def test_without_gradients_the_modules_run_as_they_are(monkeypatch):
    model = llama()
    recompute.recompute_pointwise(model, "true")
    calls = []
    monkeypatch.setattr(recompute, "checkpoint", lambda *a, **k: calls.append(1) or a[0](*a[1:]))
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(ids)
    assert calls == []
    model(ids).logits.sum().backward()
    assert len(calls) == 2 * 3


@pytest.mark.parametrize(
    "setting, hidden, wraps",
    [("auto", 64, False), ("auto", 512, True), ("true", 64, True), ("false", 512, False), ("True", 64, True)],
)
def test_auto_wraps_models_of_hidden_size_512_or_more(setting, hidden, wraps):
    model = llama(hidden=hidden, intermediate=2 * hidden, layers=1)
    assert (recompute.recompute_pointwise(model, setting) > 0) is wraps
    assert recompute.recompute_wanted(setting, hidden) is wraps


def test_wrapping_twice_wraps_once_and_another_wrapper_is_kept():
    model = llama(layers=1)
    recompute.recompute_pointwise(model, "true")
    first = model.model.layers[0].mlp.forward
    recompute.recompute_pointwise(model, "true")
    assert model.model.layers[0].mlp.forward == first
    other = llama(layers=1)
    mine = other.model.layers[0].mlp.forward = lambda x: x
    recompute.recompute_pointwise(other, "true")
    assert other.model.layers[0].mlp.forward is mine


MEASURE = """
import copy, sys, torch
sys.path.insert(0, {tests!r})
from test_recompute import llama
from grpo_cli.models import recompute
torch.set_num_threads(1)
model = llama(hidden=256, intermediate=1024, layers=4)
if {lean}:
    recompute.recompute_pointwise(model, "true")
ids = torch.randint(0, 97, (1, 2048), generator=torch.Generator().manual_seed(4))
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
before = rss()
out = model.model(ids).last_hidden_state
print(rss() - before)
"""


def _kept_mib(lean: bool) -> float:
    """Resident MiB one 2,048-token forward under autograd adds (what it keeps for the backward), in a fresh
    process where glibc maps every block of 128 KiB or more on its own (MALLOC_MMAP_THRESHOLD_), so the resident
    size follows the live tensors instead of a heap that keeps freed memory."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    code = MEASURE.format(tests=str(Path(__file__).parent), lean=lean)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(
    not Path("/proc/self/statm").exists(), reason="needs /proc/self/statm (Linux) to read the resident size"
)
def test_the_forward_keeps_much_less_and_the_planner_counts_it():
    """A 4-layer model (hidden 256, intermediate 1,024), one 2,048-token forward: the memory it adds with and
    without the wrappers, against the planner's count of each."""
    kept_plain, kept_lean = _kept_mib(False), _kept_mib(True)
    shape = Shape(
        layers=4, hidden=256, intermediate=1024, heads=4, kv_heads=2, head_dim=64, vocab=97, parameters=0, trainable=0
    )
    planned = [activation_bytes_per_token(shape, 0, 4, False, p) * 2048 / 2**20 for p in (False, True)]
    assert kept_lean < 0.75 * kept_plain, (kept_plain, kept_lean)
    assert 0.75 * planned[0] <= kept_plain <= 1.25 * planned[0], (kept_plain, planned)
    assert 0.75 * planned[1] <= kept_lean <= 1.25 * planned[1], (kept_lean, planned)


def test_a_keyword_input_is_recomputed_too():
    model = llama(layers=1)
    recompute.recompute_pointwise(model, "true")
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, 64, requires_grad=True)
    by_keyword = mlp(x=x)
    assert by_keyword.grad_fn is not None and torch.equal(by_keyword, type(mlp).forward(mlp, x))


def test_lora_adapters_get_the_same_gradients():
    peft = pytest.importorskip("peft", reason="LoRA needs peft: pip install 'grpo-cli[peft]'")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    plain = llama()
    lean = copy.deepcopy(plain)
    recompute.recompute_pointwise(lean, "true")
    plain, lean = peft.get_peft_model(plain, config), peft.get_peft_model(lean, copy.deepcopy(config))
    lean.load_state_dict(plain.state_dict())
    for model in (plain, lean):  # adapters' B start at zero: give them values so every gradient flows
        torch.manual_seed(5)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    ids = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(6))
    _, g0 = grads(plain, ids, ids)
    _, g1 = grads(lean, ids, ids)
    trained = [n for n, p in plain.named_parameters() if p.requires_grad]
    assert trained and all(torch.equal(g0[n], g1[n]) for n in trained)


def test_the_benchmark_prints_both_settings(tmp_path):
    """scripts/bench_recompute.py end to end on a small local model: both rows and the ratio line."""
    llama(hidden=128, intermediate=384, layers=2).save_pretrained(tmp_path / "model")
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_recompute.py"
    out = subprocess.run(
        [sys.executable, str(script), "--model", str(tmp_path / "model"), "--tokens", "256", "--rounds", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in (["false"], ["true"])]
    assert [r[0] for r in rows] == ["false", "true"] and all(float(v) > 0 for r in rows for v in r[1:])
    assert float(rows[1][1]) < float(rows[0][1])  # fewer KiB a token kept with it on
    assert "x the memory kept" in out.stdout
