"""What real models need: mixed precision that trains, lean log-probs under wrappers, numerics that
cannot poison the weights, dropout off, and prompts tokenized once, correctly."""

import copy
import json
import math
import os
import platform
import resource
import subprocess
import sys

import pytest
import torch
from ranks import run_ranks
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_cli.algo.objective import group_advantages, policy_loss
from grpo_cli.config import SamplerConfig, TrainConfig
from grpo_cli.data.prompts import encode_prompts
from grpo_cli.errors import GrpoError
from grpo_cli.generate.hf import HFGenerator, eos_token_ids
from grpo_cli.models.distributed import SINGLE
from grpo_cli.models.forward import score
from grpo_cli.models.loading import disable_dropout, load_model, load_tokenizer
from grpo_cli.models.logprobs import enable_logprob_forward
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision, check_pure_bf16_lr
from grpo_cli.run import build as run_setup
from grpo_cli.run import trainer
from grpo_cli.run.console import Console
from grpo_cli.samples.metrics import StepMetrics
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update import step
from helpers import flat_inputs, floats, from_grid, generate, grid, padded, token_logprobs

PROMPTS = ["1+2=", "13+4=", "5+25=", "9+8="]
ANSWERS = ["3", "17", "30", "17"]


def small_cfg(**trainer_keys) -> TrainConfig:
    cfg = TrainConfig()
    cfg.sampler.group_size, cfg.trainer.micro_batch_size = 4, 8
    for k, v in trainer_keys.items():
        setattr(cfg.trainer, k, v)
    return cfg


def rollout(model, tok, cfg, seed=0):
    """A scored rollout of PROMPTS with fixed rewards (alternating right and wrong) and advantages."""
    roll = generate(
        model,
        tok,
        PROMPTS,
        cfg.sampler.group_size,
        max_new_tokens=cfg.sampler.max_new_tokens,
        seeds=[seed + i for i in range(len(PROMPTS))],
    )
    roll.rewards = torch.tensor(
        [[float((g + j) % 2) for j in range(cfg.sampler.group_size)] for g in range(len(PROMPTS))]
    )
    roll.advantages = group_advantages(roll.rewards).flatten()
    return roll


def weights(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- precision ---------------------------------------------------------------------------------


def test_bf16_mixed_at_lr_1e_6_changes_nearly_every_fp32_master_weight_in_one_step_where_pure_bf16_does_not():
    cfg = small_cfg()
    cfg.optimizer.lr, cfg.algo.beta = 1e-6, 0.0
    tok = load_tokenizer("builtin:tiny")
    changed = {}
    for name, dtype in (("bf16-mixed", torch.float32), ("bf16", torch.bfloat16)):
        policy = load_model("builtin:tiny", dtype, "cpu")
        roll = rollout(policy, tok, cfg)
        optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 1)
        before = weights(policy)
        policy.train()
        skipped, _ = step.optimise(policy, optimizer, roll, StepSettings.of(cfg), Precision(name))
        assert not skipped
        after = weights(policy)
        changed[name] = sum(int((after[n] != before[n]).sum()) for n in before) / sum(
            p.numel() for p in before.values()
        )
        assert all(p.dtype == dtype for p in after.values())
    assert changed["bf16-mixed"] > 0.99, changed  # float32 master weights take a 1e-6 step
    assert changed["bf16"] < 0.2, changed  # the same step rounds away in bfloat16 weights


def test_bf16_mixed_loss_and_gradients_agree_with_fp32_within_bf16_tolerance():
    """Tolerance: bf16 keeps 8 significant bits (relative error ~4e-3 per op), so the loss must agree
    to 2%, the whole gradient must point the same way (cosine > 0.99 over all parameters), and every
    parameter's own gradient nearly so (cosine > 0.9: a weight whose gradient is small next to the
    rounding of the activations it multiplies, e.g. a query projection, agrees less closely)."""
    cfg = small_cfg()
    cfg.algo.beta = 0.0
    tok = load_tokenizer("builtin:tiny")
    fp32 = load_model("builtin:tiny", torch.float32, "cpu")
    roll = rollout(fp32, tok, cfg)
    # ratios scattered around 1 (some clipped), so the loss is not zero by the advantages' symmetry
    noise = torch.empty(padded(roll)[2].shape).uniform_(-0.4, 0.4, generator=torch.Generator().manual_seed(0))
    roll.old_logp = score(fp32, roll, 1.0, StepSettings.of(cfg), Precision("fp32")) + from_grid(roll, noise)
    grads, losses = {}, {}
    for name in ("fp32", "bf16-mixed"):
        model = copy.deepcopy(fp32).train()
        mask = padded(roll)[2]
        with Precision(name).autocast():
            logp, _ = token_logprobs(model, padded(roll)[0], padded(roll)[1], roll.completion_len)
        loss, _ = policy_loss(flat_inputs(logp, grid(roll, roll.old_logp), roll.advantages, mask))
        loss.backward()
        losses[name], grads[name] = float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}
    assert losses["bf16-mixed"] == pytest.approx(losses["fp32"], rel=2e-2)
    whole = [torch.cat([g.flatten() for g in grads[name].values()]) for name in ("fp32", "bf16-mixed")]
    assert torch.nn.functional.cosine_similarity(*whole, dim=0) > 0.99
    for n, g in grads["fp32"].items():
        if g.norm() > 1e-8:
            cos = torch.nn.functional.cosine_similarity(g.flatten(), grads["bf16-mixed"][n].flatten(), dim=0)
            assert cos > 0.9, (n, float(cos))


def test_pure_bf16_is_refused_where_the_learning_rate_is_too_small_to_register():
    model = load_model("builtin:tiny", torch.bfloat16, "cpu")
    with pytest.raises(GrpoError, match="trainer.precision=bf16 with optimizer.lr=1e-06.*bf16-mixed"):
        check_pure_bf16_lr(model, 1e-6)
    check_pure_bf16_lr(model, 1e-2)  # large enough for most weights: allowed


def test_frozen_models_are_stored_in_the_compute_dtype(tmp_path):
    cfg = small_cfg(precision="bf16-mixed")
    cfg.algo.behaviour = "lagged"
    cfg.algo.behaviour_refresh = 1
    policies = Policies.load(cfg, Precision("bf16-mixed"), load_model("builtin:tiny", torch.float32, "cpu"))
    frozen = [policies.held_reference, policies.held_behaviour]
    assert {p.dtype for m in frozen for p in m.parameters()} == {torch.bfloat16}


def test_a_bf16_mixed_run_trains_and_saves_float32_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = small_cfg(precision="bf16-mixed", steps=2, prompts_per_step=4, eval_before_after=False, progress=False)
    cfg.data.max_operand, cfg.data.num_test = 9, 20
    trainer.train(cfg, tmp_path, Console(progress=False))
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert {p.dtype for p in final.parameters()} == {torch.float32}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in rows] == [0.0, 0.0]


# --- lean log-probs through the model's own forward ---------------------------------------------


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while fn() runs its forward."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_memory_saved_for_backward_is_the_body_s_plus_at_most_one_chunk_not_batch_times_vocab():
    torch.manual_seed(0)
    V, B, L, T, chunk = 8192, 8, 72, 64, 64
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
    )
    enable_logprob_forward(model)
    ids, mask = torch.randint(V, (B, L)), torch.ones(B, L, dtype=torch.long)
    pos = torch.arange(L).expand(B, L)

    lean = _saved_bytes(lambda: token_logprobs(model, ids, mask, T, chunk_tokens=chunk))
    body = _saved_bytes(
        lambda: model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    )
    naive = _saved_bytes(
        lambda: (
            model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -T - 1 : -1].float().log_softmax(-1)
        )
    )
    one_chunk = chunk * V * 4
    assert lean <= body + one_chunk, (lean, body, one_chunk)
    assert naive >= body + B * T * V * 4  # what the lean path avoids: float32 logits of every position


def test_lean_log_probs_and_their_gradients_equal_a_full_vocabulary_log_softmax(tiny_model):
    model, tok = tiny_model
    model = copy.deepcopy(model)
    roll = generate(model, tok, PROMPTS, 3, max_new_tokens=5, seeds=[1, 2, 3, 4])
    T, m = roll.completion_len, padded(roll)[2].bool()
    pos = (padded(roll)[1].cumsum(-1) - 1).clamp(min=0)
    w = torch.randn(padded(roll)[2].shape, generator=torch.Generator().manual_seed(0))
    lean, _ = token_logprobs(model, padded(roll)[0], padded(roll)[1], T, temperature=0.7, chunk_tokens=7)
    (lean * w * m).sum().backward()
    lean_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = (
        type(model)
        .forward(model, input_ids=padded(roll)[0], attention_mask=padded(roll)[1], position_ids=pos)
        .logits[:, -T - 1 : -1]
        .double()
    )
    full = torch.log_softmax(logits / 0.7, -1).gather(-1, padded(roll)[0][:, -T:, None]).squeeze(-1)
    (full * w * m).sum().backward()
    assert torch.allclose(lean[m].double(), full[m], atol=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(lean_grads[n], p.grad, atol=1e-5, rtol=1e-4), n


def _ddp_rank(rank, world, model_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = load_model(model_dir, torch.float32, "cpu").train()
    ddp = DDP(model)
    tok = load_tokenizer(model_dir)
    roll = generate(model, tok, [PROMPTS[rank]], 4, max_new_tokens=4, seeds=[rank])  # each rank its own data
    logp, _ = token_logprobs(ddp, padded(roll)[0], padded(roll)[1], roll.completion_len)
    (logp * padded(roll)[2]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # this rank's own gradient, computed without DDP, to check the average really is one
    local = load_model(model_dir, torch.float32, "cpu").train()
    logp, _ = token_logprobs(local, padded(roll)[0], padded(roll)[1], roll.completion_len)
    (logp * padded(roll)[2]).sum().backward()
    dist.barrier()
    return grads, {n: p.grad.clone() for n, p in local.named_parameters()}


def test_two_gloo_ddp_ranks_have_identical_gradients_after_a_backward_through_the_logprob_path(tiny_dir, tmp_path):
    (g0, own0), (g1, own1) = run_ranks(_ddp_rank, 2, tmp_path, str(tiny_dir))
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n  # the all-reduce ran: both ranks hold the same gradient
        assert torch.allclose(g0[n], (own0[n] + own1[n]) / 2, atol=1e-6), n  # ...and it is the average
    assert any(not torch.equal(own0[n], own1[n]) for n in own0)  # the ranks' own gradients differed


# --- numerics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio_level", ["sequence", "token"])
def test_a_summed_log_ratio_of_120_gives_a_finite_loss_and_gradient(ratio_level):
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    old = torch.full((2, 4), -31.0)  # each token's log-ratio is 30, so a sequence's sums to 120 nats
    assert math.isinf(float(torch.exp(torch.tensor(120.0))))  # what an unclamped exp would give
    loss, metrics = policy_loss(
        flat_inputs(
            logp,
            old,
            torch.tensor([1.0, -1.0]),
            torch.ones(2, 4),
            ratio_level=ratio_level,
            beta=0.04,
            ref_logp=torch.full((2, 4), -40.0),
        )
    )
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in floats(metrics).values())


def test_an_update_with_a_non_finite_loss_is_skipped_and_the_weights_stay_finite():
    cfg = small_cfg()
    cfg.algo.beta = 0.0
    tok = load_tokenizer("builtin:tiny")
    policy = load_model("builtin:tiny", torch.float32, "cpu").train()
    roll = rollout(policy, tok, cfg)
    roll.advantages[3] = float("nan")
    optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 1)
    before = weights(policy)
    skipped, grad_norm = step.optimise(policy, optimizer, roll, StepSettings.of(cfg), Precision("fp32"))
    assert skipped and not math.isfinite(grad_norm)
    after = weights(policy)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not optimizer.state  # AdamW never stepped: no moments from NaN gradients either


def test_non_finite_updates_are_counted_and_patience_in_a_row_stop_the_run_with_one_sentence(monkeypatch, tmp_path):
    real = step.policy_loss
    calls = {"n": 0}

    def nan_after_first_step(*args, **kwargs):
        loss, m = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 1 else loss), m

    monkeypatch.setattr(step, "policy_loss", nan_after_first_step)
    cfg = small_cfg(
        steps=10,
        prompts_per_step=4,
        eval_before_after=False,
        progress=False,
        nonfinite_patience=2,
        micro_batch_size=64,
        save_every=1,
    )
    cfg.data.max_operand, cfg.data.num_test = 9, 20
    with pytest.raises(GrpoError, match="^2 updates in a row had a non-finite loss or gradient \\(step 3\\)"):
        trainer.train(cfg, tmp_path, Console(progress=False))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in rows] == [0.0, 1.0]  # step 3 stopped the run before its row
    final = load_model(str(tmp_path / "checkpoints" / "step-2"), torch.float32, "cpu")
    assert all(torch.isfinite(p).all() for p in final.parameters())


def test_constant_norm_divides_by_sampler_max_new_tokens_not_the_batch_s_longest_completion():
    cfg = small_cfg()
    cfg.algo.beta, cfg.algo.aggregation, cfg.sampler.max_new_tokens = 0.0, "constant_norm", 6
    tok = load_tokenizer("builtin:tiny")
    policy = load_model("builtin:tiny", torch.float32, "cpu").train()
    roll = rollout(policy, tok, cfg)
    assert roll.completion_len < cfg.sampler.max_new_tokens  # the tiny model ends its answers early
    optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 1)
    record = StepMetrics()
    step.optimise(policy, optimizer, roll, StepSettings.of(cfg), Precision("fp32"), record=record)
    # on-policy, mu = 1: every ratio is 1, so the loss is -sum_i A_i |o_i| / (B * max_new_tokens)
    lengths = padded(roll)[2].sum(1).double()
    want = float(-(roll.advantages.double() * lengths).sum() / (len(lengths) * cfg.sampler.max_new_tokens))
    assert record.reduce(SINGLE)["loss"] == pytest.approx(want, abs=1e-6)


def test_dropout_is_off_in_every_loaded_model(tmp_path):
    from tiny_models import tiny

    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            attention_dropout=0.5,
        )
    )
    model.model.layers[0].mlp.act_fn = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.SiLU())
    disable_dropout(model)
    model.train()
    ids = torch.randint(len(tok), (2, 8))
    assert torch.equal(model(ids).logits, model(ids).logits)  # in training mode, no randomness
    tiny.save(
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                attention_dropout=0.5,
            )
        ),
        tok,
        tmp_path / "m",
    )
    loaded = load_model(str(tmp_path / "m"), torch.float32, "cpu").train()
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in loaded.model.layers)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir):
    roll = None
    grads = []
    for checkpointing in (False, True):
        model = load_model(str(tiny_dir), torch.float32, "cpu", gradient_checkpointing=checkpointing)
        if roll is None:
            roll = generate(model, load_tokenizer(str(tiny_dir)), PROMPTS, 2, max_new_tokens=4, seeds=[0, 1, 2, 3])
        model.train()
        logp, _ = token_logprobs(model, padded(roll)[0], padded(roll)[1], roll.completion_len)
        (logp * padded(roll)[2]).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert model.model.gradient_checkpointing
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6), n


def test_trainer_threads_sets_torch_s_intra_op_threads():
    from grpo_cli.models.runtime import set_threads

    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_deterministic_on_cuda_leaves_attention_on_sdpa_s_math_kernels_only():
    """trainer.deterministic on CUDA: the fused SDPA kernels (whose backward adds with atomics: two runs
    parted after one step on an H100) are switched off, the math kernel left on; on CPU nothing of SDPA's
    changes. Run in a child process: the switches and the deterministic mode are global."""
    import subprocess
    import sys

    code = """
import torch
from grpo_cli.models.runtime import prepare_process
b = torch.backends.cuda
flags = lambda: (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.cudnn_sdp_enabled(), b.math_sdp_enabled())
prepare_process(1, torch.device("cpu"), deterministic=True)
cpu = flags()
prepare_process(1, torch.device("cuda"), deterministic=True)
print(cpu, flags(), torch.are_deterministic_algorithms_enabled())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "(True, True, True, True) (False, False, False, True) True"


ALLOCATION_LOOP = """
import json, resource, torch
from grpo_cli.models.runtime import reuse_freed_memory
applied = reuse_freed_memory()
faults = []
for _ in range(40):  # a step's pattern: large blocks of two dtypes and temporaries, all freed at the end
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.ones(16 << 20)
    b = torch.ones(8 << 20, dtype=torch.bfloat16)
    total = a[: 4 << 20].sum() + b.float().sum()
    del a, b, total
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


@pytest.mark.timing
@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="reuse_freed_memory tunes glibc's malloc; this is not Linux with glibc",
)
def test_freed_memory_is_reused_so_a_repeated_step_touches_no_new_pages():
    """Page faults counted, not time: with reuse, an iteration faults in nothing unless one of its
    blocks finds no hole, and the heap then grows by that block; with glibc's defaults
    (GRPO_MALLOC=system) the large blocks are mmapped and faulted in again, every iteration.
    When and how often the heap grows varies from run to run with the address-space layout: in 40
    runs here 2-5 of 39 iterations grew it (80-176 MiB in all, against ~3.7 GiB faulted by the
    defaults), the last as late as iteration 22, and CI once saw a growth after iteration 30. So
    the test bounds the total growth and asks most iterations to touch nothing, never for a
    settled tail."""

    def run(malloc: str) -> dict:
        env = {**os.environ, "GRPO_MALLOC": malloc, "OMP_NUM_THREADS": "1"}
        out = subprocess.run(
            [sys.executable, "-c", ALLOCATION_LOOP], capture_output=True, text=True, env=env, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    pages = ((16 << 20) * 4 + (8 << 20) * 2 + (8 << 20) * 4) // resource.getpagesize()  # a, b, b.float(): 28,672
    reused, system = run(""), run("system")
    assert reused["applied"] and not system["applied"]
    assert all(f > 0.5 * pages for f in system["faults"][1:]), system["faults"]
    steady = reused["faults"][1:]
    assert sum(steady) < 0.1 * sum(system["faults"][1:]), reused["faults"]  # 2-5% measured
    assert sum(f < 0.01 * pages for f in steady) >= 0.75 * len(steady), reused["faults"]  # 34-37 of 39 measured


# --- prompts tokenized once, correctly ----------------------------------------------------------


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer that adds BOS itself and whose chat template also writes BOS: the case
    where tokenizing a rendered prompt with special tokens would give two."""
    words = [
        "<pad>",
        "<s>",
        "</s>",
        "<|user|>",
        "<|assistant|>",
        "<|end|>",
        "<|system|>",
        "hello",
        "there",
        "2",
        "+",
        "=",
    ]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(r"(<\|[a-z]+\|>|<s>|</s>| )", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return fast


def test_chat_template_prompt_ids_equal_apply_chat_template_s_with_one_bos():
    tok = chat_tokenizer()
    messages = [{"role": "user", "content": "hello"}]
    want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok(rendered)["input_ids"][:2] == [1, 1]  # the bug: tokenizing the rendered text adds a second BOS
    assert encode_prompts(tok, [rendered], chat_template=True) == [list(want)]
    assert HFGenerator(tok, chat_template=True).encode([rendered]) == [list(want)]
    assert encode_prompts(tok, ["hello"], chat_template=False) == [[1, 7]]  # a plain prompt: BOS once


def test_the_data_pipeline_renders_chat_prompts_that_encode_to_apply_chat_template_s_ids():
    from grpo_cli.config import DataConfig
    from grpo_cli.data.tasks import load_data

    tok = chat_tokenizer()
    cfg = DataConfig(
        name="arithmetic", max_operand=9, num_test=5, chat_template=True, system_prompt="there", max_prompt_length=100
    )
    data = load_data(cfg, tok)
    prompt = data["test"]["prompt"][0]
    raw = prompt.split("<|user|>")[1].split("<|end|>")[0]
    want = tok.apply_chat_template(
        [{"role": "system", "content": "there"}, {"role": "user", "content": raw}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    assert HFGenerator(tok, chat_template=True).encode([prompt]) == [list(want)]


def test_generation_stops_at_every_eos_the_generation_config_lists(tiny_model):
    model, tok = tiny_model
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("5"), tok.eos_token_id]
    assert eos_token_ids(model, tok) == sorted({tok.convert_tokens_to_ids("5"), tok.eos_token_id})
    roll = HFGenerator(tok).generate(model, ["2+3=", "20+5="], 8, SamplerConfig(6), seeds=[0, 1])
    ends = [c for c, t in zip(roll.completions, roll.truncated.tolist()) if not t]
    assert ends and all("5" not in c[:-1] for c in ends)  # nothing after a "5": it ended the completion
