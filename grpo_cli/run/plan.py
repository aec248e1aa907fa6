"""The memory planner: peak memory by part, estimated from the config and the model's config before
any weights load, and the token budget that fits `trainer.memory_gib`.

How it works in detail: docs/internals.md, grpo_cli/run/plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo_cli.config import reference_in_worker
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import GENERATORS
from grpo_cli.models.logprobs import CHUNK_LOGITS
from grpo_cli.models.memory import (
    ALLOCATOR_SLACK,
    CUDA_SLACK,
    GIB,
    Shape,
    activation_bytes_per_token,
    dtype_bytes,
    model_shape,
    noise_steps_ahead,
    resident_bytes,
)
from grpo_cli.models.packer import largest_micro_batch
from grpo_cli.models.recompute import recompute_wanted
from grpo_cli.registry import load


@dataclass
class Plan:
    """Bytes by part; `tokens` the micro-batch size in tokens the activations are counted for."""

    persistent: dict[str, float]
    generation: dict[str, float]
    update: dict[str, float]
    tokens: int
    per_token: float  # activation bytes per token of a micro-batch
    budget: int = 0  # the token budget per micro-batch the run uses (planned() sets it)
    redo: Callable[..., Plan] | None = (
        None  # plan(...) again with the same inputs, given what a step really formed (from_samples)
    )

    @property
    def total(self) -> float:
        return sum(self.persistent.values()) + max(sum(self.generation.values()), sum(self.update.values()))

    def from_samples(self, row: dict) -> "Plan":
        """The plan again, counting what a step's samples really formed rather than the worst case: its
        longest row (prompt and completion, or a whole episode) and its largest micro-batch's positions
        (the metrics row's row_tokens_max and micro_batch_positions)."""
        assert self.redo is not None, "planned() sets it"
        return self.redo(row_len=int(row["row_tokens_max"]), tokens=int(row["micro_batch_positions"]))

    def line(self) -> str:
        """One line: the total, then each part in GiB."""

        def parts(d):
            return ", ".join(f"{k} {v / GIB:.2f}" for k, v in d.items() if v >= 0.005 * GIB)

        return (
            f"memory plan: peak {self.total / GIB:.2f} GiB = all run ({parts(self.persistent)}) + the larger of "
            f"generation ({parts(self.generation)}) and the update ({parts(self.update)}; "
            f"{self.per_token / 2**10:.0f} KiB per token, {self.tokens:,} tokens per micro-batch) [GiB]"
        )


def row_length(cfg, longest_prompt: int) -> int:
    """The longest row a step can hold: the longest prompt and max_new_tokens, or an episode's env.max_tokens."""
    after = cfg.sampler.max_new_tokens
    env = getattr(cfg, "env", None)
    if env is not None and (env.tools or env.factory or getattr(env, "agent", None)):
        after = max(after, env.max_tokens)  # an episode's tokens after its prompt
    return longest_prompt + after


def plan(
    cfg,
    shape: Shape,
    *,
    longest_prompt: int,
    param_bytes: int,
    frozen_bytes: int,
    act_bytes: int,
    world_size: int = 1,
    runtime: float | None = None,
    budget: int | None = None,
    row_len: int | None = None,
    tokens: int | None = None,
    device_type: str = "cpu",
) -> Plan:
    """The estimate for this config (see the module docstring). `longest_prompt` in tokens; `budget`, when
    given, stands for trainer.max_tokens_per_micro_batch. `row_len` and `tokens`, when given, are a step's
    longest row and largest micro-batch as sampled (Plan.from_samples), in place of the worst case."""
    t, s, lora = cfg.trainer, cfg.sampler, cfg.model.lora.r > 0
    row_len = row_len or row_length(cfg, longest_prompt)
    trainable_bytes = 4 if lora else param_bytes  # a LoRA adapter is float32
    rows = t.prompts_per_step // max(world_size, 1) * s.group_size
    persistent = persistent_terms(cfg, shape, param_bytes, frozen_bytes, runtime)
    generation = generation_terms(
        cfg, shape, rows, row_len, frozen_bytes if lora else param_bytes, act_bytes, device_type
    )
    pointwise = recompute_wanted(cfg.model.recompute_pointwise, shape.hidden)
    per_token = activation_bytes_per_token(shape, row_len, act_bytes, cfg.model.gradient_checkpointing, pointwise)
    # The largest micro-batch the step's packer can form, pads and filler included (packer.py).
    budget = budget if budget is not None else t.max_tokens_per_micro_batch
    tokens = tokens or largest_micro_batch(row_len, token_budget=budget, batch_rows=min(t.micro_batch_size, rows))
    completion = tokens * s.max_new_tokens // max(row_len, 1)  # the micro-batch's completion tokens
    head_positions = min(completion, max(1, CHUNK_LOGITS // shape.vocab))
    slack = CUDA_SLACK if device_type == "cuda" else ALLOCATOR_SLACK
    update = {
        "gradients": shape.trainable * trainable_bytes,
        "activations": slack * tokens * per_token,
        "logits": slack * head_tensors(cfg) * head_positions * shape.vocab * 4,
        "backward": slack * tokens * (2 * shape.hidden + 2 * shape.intermediate) * 4,
    }
    if act_bytes < param_bytes and not lora:  # bf16-mixed: autocast keeps a bf16 copy of the weights it cast
        update["cast weights"] = shape.parameters * act_bytes
    return Plan(
        persistent=persistent, generation=generation, update=update, tokens=int(tokens), per_token=slack * per_token
    )


def persistent_terms(cfg, shape: Shape, param_bytes: int, frozen_bytes: int, runtime: float | None) -> dict:
    """What stays for the whole run: the runtime, the weights, a reference and a behaviour, AdamW's moments."""
    algo, lora, P = cfg.algo, cfg.model.lora.r > 0, shape.parameters
    persistent = {
        "runtime": resident_bytes() if runtime is None else runtime,
        "weights": P * (frozen_bytes if lora else param_bytes) + (shape.trainable * 4 if lora else 0),
    }
    if algo.beta != 0 and not lora and not reference_in_worker(cfg):  # else the generation worker holds it
        persistent["reference"] = P * frozen_bytes
    if algo.behaviour in ("frozen", "lagged") and not lora:
        persistent["behaviour"] = P * frozen_bytes
    persistent["optimizer"] = 2 * shape.trainable * (4 if lora else param_bytes)  # AdamW's two moments
    return persistent


def generation_terms(cfg, shape: Shape, rows: int, row_len: int, weight_bytes: int, act_bytes: int, device_type: str):
    """What sampling holds: the KV cache, the sampler's [rows, vocab] tensors and noise drawn ahead, an episode's
    kept turns, and what the generator back-end holds beside them (generate/base.py, Backend.memory)."""
    s = cfg.sampler
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * act_bytes
    ahead = noise_steps_ahead(rows, shape.vocab, s.max_new_tokens, device_type)
    generation = {
        "KV cache": rows * row_len * kv_per_token,  # sampling: logits, scores, log-softmax, and the noise
        "sampling": rows * shape.vocab * 4 * (3 + ahead),  # drawn `ahead` tokens at a time: [rows, vocab] fp32
    }
    env = getattr(cfg, "env", None)
    if env is not None and (
        env.tools or env.factory or getattr(env, "agent", None)
    ):  # episodes: each decoded row kept for its next turn
        generation["kept turns"] = generation["KV cache"]
    gen = getattr(cfg, "generator", None)
    term = GENERATORS[gen.name].memory if gen is not None else None
    if term is not None:
        generation.update(
            load(term)(gen, shape, device_type=device_type, weight_bytes=weight_bytes, act_bytes=act_bytes)
        )
    return generation


def head_tensors(cfg) -> int:
    """[chunk, vocab] float32 tensors the plan counts for the head. logprobs.TokenLogProb holds the logits and
    the probabilities (which become the gradient) for a moment, and one such tensor with the allocator's
    slack is what the measured peaks fit (tests/models/test_memory.py's three shapes: counting two tensors
    overestimated the wide, head-heavy one by 24%, past the 20% the test allows). Three through autograd's
    ops, as before, when an entropy bonus differentiates the entropy."""
    return 3 if cfg.algo.entropy_coef else 1


def fit(cfg, shape: Shape, **plan_args) -> int:
    """The largest token budget per micro-batch whose plan stays within trainer.memory_gib, or a GrpoError
    naming the knob when nothing fits (or the budget the config sets does not)."""
    t, s = cfg.trainer, cfg.sampler
    limit = t.memory_gib * GIB
    row_len = row_length(cfg, plan_args["longest_prompt"])

    def total(tokens: int) -> float:
        return plan(cfg, shape, budget=tokens, **plan_args).total

    smallest = plan(cfg, shape, budget=1, **plan_args)
    fixed, gen = sum(smallest.persistent.values()), sum(smallest.generation.values())
    if fixed + gen > limit:
        raise GrpoError(
            f"trainer.memory_gib={t.memory_gib:g} cannot hold generation: the weights, optimizer state and process "
            f"need {fixed / GIB:.2f} GiB and the KV cache of {t.prompts_per_step} prompts x {s.group_size} completions "
            f"{gen / GIB:.2f} GiB more; lower trainer.prompts_per_step or sampler.max_new_tokens, use model.lora, or "
            f"raise trainer.memory_gib."
        )
    low, high = 0, 1
    while total(high) <= limit and high < 1 << 40:  # the plan grows with the budget: bisect its last fit
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if total(mid) <= limit else (low, mid)
    if t.max_tokens_per_micro_batch:
        if t.max_tokens_per_micro_batch > low:
            raise GrpoError(
                f"trainer.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch} does not fit in "
                f"trainer.memory_gib={t.memory_gib:g} (room for {low:,} tokens); lower it, or leave it at 0 and the "
                "planner picks the budget."
            )
        return t.max_tokens_per_micro_batch
    if low < row_len:
        raise GrpoError(
            f"trainer.memory_gib={t.memory_gib:g} leaves room for {low:,} tokens per micro-batch, fewer than one "
            f"completion with the longest prompt ({row_len:,}); raise trainer.memory_gib, lower "
            "sampler.max_new_tokens, or set model.gradient_checkpointing=true."
        )
    return low


def planned(
    cfg,
    tokenizer_prompts: list[list[int]] | None,
    precision,
    world_size: int = 1,
    resumed_budget: int | None = None,
    device: torch.device | None = None,
) -> Plan:
    """The plan, its `budget` the token budget per micro-batch to run with (trainer.max_tokens_per_micro_batch,
    or the one memory_gib picks). Raises GrpoError when trainer.memory_gib cannot be met. A resumed run keeps the
    budget its checkpoint ran with (`resumed_budget`) while memory_gib is still set, so it batches, and
    so computes, exactly as the uninterrupted run would."""
    m = cfg.model
    shape = model_shape(m.path, m.trust_remote_code, m.lora if m.lora.r else None)
    longest = max((len(p) for p in tokenizer_prompts), default=0) if tokenizer_prompts else 0
    compute = precision.frozen_dtype  # the compute dtype
    kwargs: dict[str, Any] = dict(
        longest_prompt=longest,
        param_bytes=dtype_bytes(precision.param_dtype),
        frozen_bytes=dtype_bytes(precision.frozen_dtype),
        act_bytes=dtype_bytes(compute),
        world_size=world_size,
    )
    # The process, measured once so every plan below counts the same; on a GPU the plan is of CUDA's
    # allocations, which the process's own memory is not part of.
    kwargs["runtime"] = 0.0 if device is not None and device.type == "cuda" else resident_bytes()
    kwargs["device_type"] = device.type if device is not None else "cpu"
    budget = cfg.trainer.max_tokens_per_micro_batch
    row = row_length(cfg, longest)
    if budget and budget < row:  # that row would run alone, past the budget
        raise GrpoError(
            f"trainer.max_tokens_per_micro_batch={budget} is smaller than the longest row a step can hold "
            f"({row} tokens: the longest prompt and the tokens after it); raise it to {row} or more, or "
            "lower sampler.max_new_tokens."
        )
    if cfg.trainer.memory_gib:
        budget = resumed_budget if resumed_budget and not budget else fit(cfg, shape, **kwargs)
    out = plan(cfg, shape, budget=budget or None, **kwargs)
    out.budget, out.redo = budget, lambda **seen: plan(cfg, shape, budget=budget or None, **kwargs, **seen)
    return out
