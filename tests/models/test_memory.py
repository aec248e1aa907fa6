"""The memory planner (memory.py): its parts worked by hand, the token budget trainer.memory_gib picks and
the configs it refuses, and (slow lane) its estimate against the measured peak of real runs."""

import json
import random
import re

import pytest
import torch

from grpo_cli.config import TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models.memory import ALLOCATOR_SLACK, CUDA_SLACK, GIB, Shape, model_shape
from grpo_cli.run.plan import fit, plan
from helpers import FAST, grpo_process, read_jsonl

SHAPE = Shape(
    layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, parameters=1000, trainable=1000
)


def cfg(**trainer) -> TrainConfig:
    c = TrainConfig()
    c.trainer.prompts_per_step, c.sampler.group_size, c.sampler.max_new_tokens = 2, 4, 20
    c.trainer.micro_batch_size = 4
    for k, v in trainer.items():
        setattr(c.trainer, k, v)
    return c


def test_every_part_of_the_plan_worked_by_hand():
    p = plan(cfg(), SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=100.0)
    # All run: 1000 parameters x 4 bytes each for the weights and the beta = 0.04 reference; AdamW 2 x 4000.
    assert p.persistent == {"runtime": 100.0, "weights": 4000, "reference": 4000, "optimizer": 8000}
    # With a generation worker, the worker scores the reference (generator.score_reference): not this process's.
    in_worker = cfg()
    in_worker.generator.worker = True
    for worker in (cfg(max_staleness=1), in_worker):
        kept = plan(worker, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=100.0)
        assert kept.persistent == {"runtime": 100.0, "weights": 4000, "optimizer": 8000}
        worker.generator.score_reference = False
        kept = plan(worker, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=100.0)
        assert kept.persistent["reference"] == 4000
    # Generation: 2 prompts x 4 = 8 rows of 12 + 20 = 32 tokens; K and V of 2 layers x 1 head x 4 dims, fp32.
    assert p.generation["KV cache"] == 8 * 32 * (2 * 2 * 1 * 4 * 4)
    # SamplerConfig: logits, scores and log-softmax, [rows, vocab] fp32, and the noise drawn 16 tokens ahead.
    assert p.generation["sampling"] == 8 * 10 * 4 * (3 + 16)
    # Per token and layer: norms 4h = 32, q 8, k and v repeated to both heads 16, attention out and o_proj's
    # input 16, MLP 4 x 16 = 64: 136 floats = 544 bytes, plus the 32-token mask row in fp32 (128 bytes).
    assert p.per_token == pytest.approx(2 * (136 * 4 + 32 * 4) * ALLOCATOR_SLACK)
    # A micro-batch of 4 rows at full length: 128 tokens.
    assert p.tokens == 128
    assert p.update["activations"] == pytest.approx(128 * p.per_token)
    assert p.update["gradients"] == 4000
    # The head: 4 rows x 20 completion tokens = 80 positions, one [positions, vocab] fp32 tensor (3 with an
    # entropy bonus); the backward's gradients in flight, 2h + 2 x intermediate per token; all three held
    # with the allocator's slack.
    assert p.update["logits"] == pytest.approx(ALLOCATOR_SLACK * 1 * 80 * 10 * 4)
    bonus = cfg()
    bonus.algo.entropy_coef = 0.01
    assert plan(bonus, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=100.0).update[
        "logits"
    ] == pytest.approx(ALLOCATOR_SLACK * 3 * 80 * 10 * 4)
    assert p.update["backward"] == pytest.approx(ALLOCATOR_SLACK * 128 * (2 * 8 + 2 * 16) * 4)
    gen, upd = sum(p.generation.values()), sum(p.update.values())
    assert p.total == pytest.approx(100 + 16000 + max(gen, upd))


def test_a_cpu_decode_counts_the_packed_copies_of_its_large_weights():
    """generator.matmul (generate/packed.py): decoding on a CPU multiplies by packed copies of every projection and
    head of at least 2**18 elements, counted in generation (bf16 copies under bf16 autocast); on CUDA, or with
    matmul=plain, none."""
    # SmolLM2-135M's sizes: q and o 576 x 576 = 331,776 and the MLP's 576 x 1,536 = 884,736 elements are packed,
    # k and v 576 x 192 = 110,592 are not; the head 49,152 x 576 = 28,311,552 is.
    shape = Shape(
        layers=30,
        hidden=576,
        intermediate=1536,
        heads=9,
        kv_heads=3,
        head_dim=64,
        vocab=49152,
        parameters=134_515_008,
        trainable=134_515_008,
    )
    want = 4 * (30 * (2 * 331_776 + 3 * 884_736) + 28_311_552)
    c = cfg()
    p = plan(c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0)
    assert p.generation["packed weights"] == want == 511_377_408
    assert (
        "packed weights"
        not in plan(
            c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0, device_type="cuda"
        ).generation
    )
    # bf16-mixed, or generator.weights=bf16: bf16 copies, half the bytes
    assert (
        plan(c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=2, act_bytes=2, runtime=0.0).generation[
            "packed weights"
        ]
        == want // 2
    )
    c.generator.weights = "bf16"
    assert (
        plan(c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0).generation[
            "packed weights"
        ]
        == want // 2
    )
    c.generator.matmul = "plain"
    assert (
        "packed weights"
        not in plan(c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0).generation
    )
    assert (
        "packed weights"
        not in plan(cfg(), SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0).generation
    )  # no layer of the small shape is large enough


def test_on_cuda_the_update_s_transients_take_cuda_s_factor_and_the_noise_its_larger_budget():
    """On CUDA the peak is allocated tensors, not resident pages: the transient parts scale by CUDA_SLACK
    (1.25) instead of the CPU allocator's 1.6; the persistent parts are the same bytes."""
    cpu = plan(cfg(), SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0)
    gpu = plan(
        cfg(), SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0, device_type="cuda"
    )
    assert CUDA_SLACK == 1.25 and gpu.persistent == cpu.persistent
    assert gpu.per_token == pytest.approx(2 * (136 * 4 + 32 * 4) * 1.25)
    assert gpu.update["logits"] == pytest.approx(1.25 * 1 * 80 * 10 * 4)
    assert gpu.update["backward"] == pytest.approx(1.25 * 128 * (2 * 8 + 2 * 16) * 4)
    assert gpu.generation["sampling"] == 8 * 10 * 4 * (3 + 16)  # 20 tokens, vocab 10: 16 ahead on either


def test_episodes_keep_a_second_copy_of_the_cache_for_their_next_turn():
    """With tools or an environment, each decoded row's keys and values are kept for its next turn
    (generate/turn_cache.py): generation holds the cache twice; a single-turn run once."""
    c = cfg()
    single = plan(c, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0)
    c.env.tools = ["calculator"]
    episodes = plan(c, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0)
    assert "kept turns" not in single.generation
    row = 12 + c.env.max_tokens  # an episode's row: the prompt and env.max_tokens
    assert episodes.generation["KV cache"] == episodes.generation["kept turns"] == 8 * row * (2 * 2 * 1 * 4 * 4)


def test_a_step_s_samples_replace_the_worst_case_rows_and_micro_batch():
    """Plan.from_samples: the longest row and the largest micro-batch a step really formed (an episode's
    whole length, a packed micro-batch's positions) in place of prompt + max_new_tokens and the row count."""
    p = plan(
        cfg(), SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=100.0, row_len=9, tokens=30
    )
    assert p.generation["KV cache"] == 8 * 9 * (2 * 2 * 1 * 4 * 4)  # 8 rows of 9 tokens, not 32
    # Per token: 136 floats as in the worked plan above, and the mask row now 9 positions wide.
    assert p.per_token == pytest.approx(2 * (136 * 4 + 9 * 4) * ALLOCATOR_SLACK)
    assert p.tokens == 30 and p.update["activations"] == pytest.approx(30 * p.per_token)
    assert p.update["backward"] == pytest.approx(ALLOCATOR_SLACK * 30 * (2 * 8 + 2 * 16) * 4)


def test_gradient_checkpointing_keeps_one_input_per_layer_and_one_layer_in_full():
    c = cfg()
    c.model.gradient_checkpointing = True
    p = plan(c, SHAPE, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.0)
    assert p.per_token == pytest.approx((2 * 8 * 4 + 136 * 4 + 32 * 4) * ALLOCATOR_SLACK)


def test_a_token_budget_counts_its_tokens_and_lora_trains_only_the_adapter():
    c = cfg(max_tokens_per_micro_batch=50)
    c.model.lora.r = 4
    shape = Shape(**{**SHAPE.__dict__, "trainable": 100})
    p = plan(c, shape, longest_prompt=12, param_bytes=4, frozen_bytes=2, act_bytes=2, runtime=0.0)
    assert p.tokens == 50
    assert p.persistent["weights"] == 1000 * 2 + 100 * 4  # a bf16 base and a float32 adapter
    assert "reference" not in p.persistent  # the base with the adapter off
    assert p.persistent["optimizer"] == 2 * 100 * 4 and p.update["gradients"] == 400


def test_memory_gib_picks_the_largest_budget_that_fits():
    c = cfg(memory_gib=1.0)
    args = dict(longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=0.5 * GIB)
    budget = fit(c, SHAPE, **args)
    assert plan(c, SHAPE, budget=budget, **args).total <= GIB < plan(c, SHAPE, budget=budget + 1, **args).total
    # A budget the config sets is kept when it fits, and refused when it does not.
    c.trainer.max_tokens_per_micro_batch = budget // 2
    assert fit(c, SHAPE, **args) == budget // 2
    c.trainer.max_tokens_per_micro_batch = budget + 1
    with pytest.raises(GrpoError, match="does not fit in trainer.memory_gib=1"):
        fit(c, SHAPE, **args)


@pytest.mark.parametrize(
    "runtime, gib, knob",
    [
        (0.2, 0.25, "sampler.max_new_tokens"),  # room for fewer tokens than one completion
        (1.5, 1.0, "trainer.prompts_per_step"),  # not even generation fits
    ],
)
def test_a_limit_that_cannot_be_met_is_one_sentence_naming_the_knob(runtime, gib, knob):
    c = cfg(memory_gib=gib)
    c.sampler.max_new_tokens = 20000
    big = Shape(
        **{
            **SHAPE.__dict__,
            "layers": 24,
            "hidden": 1024,
            "intermediate": 4096,
            "heads": 16,
            "kv_heads": 16,
            "head_dim": 64,
            "parameters": 1000,
        }
    )
    c.trainer.prompts_per_step = 1 if knob != "trainer.prompts_per_step" else 64
    with pytest.raises(GrpoError) as e:
        fit(c, big, longest_prompt=12, param_bytes=4, frozen_bytes=4, act_bytes=4, runtime=runtime * GIB)
    assert knob in str(e.value) and "trainer.memory_gib" in str(e.value) and str(e.value).count(". ") == 0


def test_parameter_counts_come_from_the_meta_device_without_loading_weights(tiny_dir, tiny_model):
    model, _ = tiny_model
    shape = model_shape(str(tiny_dir))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.layers == model.config.num_hidden_layers and shape.vocab == model.config.vocab_size


def test_a_run_prints_its_plan_and_an_impossible_limit_is_refused_before_the_model_loads(tmp_path):
    out = grpo_process("train", f"output_dir={tmp_path / 'ok'}", *FAST, check_rc=0)
    assert re.search(r"memory plan: peak [0-9.]+ GiB", out.stdout + out.stderr)
    rows = [r for r in read_jsonl(tmp_path / "ok" / "metrics.jsonl") if "reward_mean" in r]
    assert all(r["peak_memory_gib"] > 0.1 for r in rows)
    bad = grpo_process("train", f"output_dir={tmp_path / 'bad'}", *FAST, "trainer.memory_gib=0.01", check_rc=2)
    text = bad.stdout + bad.stderr
    assert "trainer.memory_gib=0.01 cannot hold generation" in text and "Traceback" not in text
    assert "loaded the model" not in text  # refused before any weights load


# --- the estimate against measured peaks (slow lane) -----------------------------------------------


def random_model(root, *, hidden, intermediate, layers, heads, kv_heads, vocab=4000, seed=0):
    """A random Llama with one token per id: it almost never samples EOS, so every row runs to the cap,
    the case the plan is written for."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(root)
    tok = Tokenizer(models.WordLevel(vocab={f"<t{i}>": i for i in range(vocab)}, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<t\d+>"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<t0>", eos_token="<t1>", unk_token="<t0>", padding_side="left"
    ).save_pretrained(root)
    rng = random.Random(seed)
    rows = [{"prompt": "".join(f"<t{rng.randrange(2, vocab)}>" for _ in range(16)), "answer": "1"} for _ in range(8)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


SHAPES = {  # three shapes: wide and shallow, deep with grouped-query attention, a token budget without a reference
    "wide": (
        dict(hidden=384, intermediate=1536, layers=4, heads=6, kv_heads=6),
        [
            "trainer.prompts_per_step=2",
            "sampler.group_size=8",
            "sampler.max_new_tokens=384",
            "trainer.micro_batch_size=16",
        ],
    ),
    "deep-gqa": (
        dict(hidden=256, intermediate=768, layers=12, heads=8, kv_heads=2),
        [
            "trainer.prompts_per_step=2",
            "sampler.group_size=4",
            "sampler.max_new_tokens=512",
            "trainer.micro_batch_size=4",
        ],
    ),
    "budget": (
        dict(hidden=512, intermediate=1024, layers=6, heads=8, kv_heads=4),
        [
            "trainer.prompts_per_step=1",
            "sampler.group_size=8",
            "sampler.max_new_tokens=448",
            "trainer.max_tokens_per_micro_batch=2048",
            "algo.beta=0",
        ],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_planned_peak_is_within_20_percent_of_the_measured_one(name, tmp_path):
    shape, overrides = SHAPES[name]
    model = random_model(tmp_path / "model", **shape)
    run = tmp_path / "run"
    out = grpo_process(
        "train",
        f"model.path={model}",
        "data=files",
        f"data.train_file={model / 'prompts.jsonl'}",
        "data.test_size=2",
        "reward=length",
        "trainer.steps=2",
        "trainer.eval_before_after=false",
        "trainer.eval_every=0",
        "trainer.log_completions_every=0",
        "trainer.save_every=10",
        "trainer.progress=false",
        "optimizer.lr=1e-5",
        "trainer.threads=1",
        f"output_dir={run}",
        *overrides,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    planned = float(re.search(r"memory plan: peak ([0-9.]+) GiB", out.stdout + out.stderr).group(1))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r]
    measured = rows[-1]["peak_memory_gib"]
    assert rows[-1]["completion_len"] > 0.9 * int(next(o for o in overrides if "max_new_tokens" in o).split("=")[1])
    print(f"{name}: planned {planned:.2f} GiB, measured {measured:.2f} GiB ({planned / measured - 1:+.0%})")
    assert abs(planned - measured) <= 0.2 * measured, (planned, measured, out.stdout[:2000])


@pytest.mark.slow
def test_the_tool_demo_s_plan_from_its_samples_is_within_25_percent_of_its_peak(tmp_path):
    """Episodes: the plan before the run counts every row at env.max_tokens (an upper bound); the plan again
    from the first step's samples counts the episodes as they were, and lands within 25% of the measured peak."""
    out = grpo_process(
        "train",
        "experiment=tool_use",
        "trainer.steps=3",
        "trainer.eval_before_after=false",
        "trainer.eval_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        f"output_dir={tmp_path}",
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    before = float(re.search(r"^memory plan: peak ([0-9.]+) GiB", text, re.M).group(1))
    sampled = float(re.search(r"from this step's samples, memory plan: peak ([0-9.]+) GiB", text).group(1))
    measured = max(r["peak_memory_gib"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "reward_mean" in r)
    print(f"tool demo: planned {before:.2f} GiB before, {sampled:.2f} GiB from samples, measured {measured:.2f} GiB")
    assert before >= measured and abs(sampled - measured) <= 0.25 * measured
