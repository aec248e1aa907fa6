"""What the tests share: one way to run the CLI (in this process, or in a fresh one as a user would),
the short-run overrides, and readers of a run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.generate.hf import HFGenerator

# A run small enough for a test: 4 prompts x G = 4 per step, no held-out scoring, plain log lines.
SMALL = [
    "trainer.prompts_per_step=4",
    "sampler.group_size=4",
    "trainer.eval_before_after=false",
    "trainer.progress=false",
]
SMALL_DATA = ["data.max_operand=9", "data.num_test=20"]  # the arithmetic task at 100 problems
FAST = ["trainer.steps=2", *SMALL, *SMALL_DATA]


class _Timing(frozenset):
    """The metrics that differ between identical runs or machines: these names, and every efficiency/<phase>."""

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or str(key).startswith("efficiency/")


TIMING = _Timing(
    {
        "seconds",
        "gen_s",
        "score_s",
        "update_s",
        "tokens_per_s",
        "env/seconds",
        "env/call_seconds",
        "peak_memory_gib",
        "memory_gib",
        "health/memory_growth",
        "push_s",
        "wait_s",
        "worker/gen_s",
        "worker/score_s",
        "gen_floor_s",
    }
)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def grpo(*args, hydra_dir: Path | None = None) -> int:
    """`grpo ARGS` in this process (Hydra and all); its exit code. `hydra_dir`: where Hydra's run
    directory goes when no output_dir is given."""
    from grpo_cli.cli import main

    extra = [f"hydra.run.dir={hydra_dir}"] if hydra_dir else []
    with pytest.raises(SystemExit) as e:
        main([*map(str, args), *extra])
        raise SystemExit(0)
    return e.value.code or 0


def grpo_process(
    *args, cwd=None, env: dict | None = None, timeout: int = 600, check_rc: int | None = None
) -> subprocess.CompletedProcess:
    """`grpo ARGS` in a fresh process, one torch thread, as a user would run it; `check_rc` asserts the
    exit code (showing the output when it differs)."""
    out = subprocess.run(
        [sys.executable, "-m", "grpo_cli.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **ONE_THREAD, **(env or {})},
    )
    if check_rc is not None:
        assert out.returncode == check_rc, out.stdout[-3000:] + out.stderr[-3000:]
    return out


REPO = Path(__file__).resolve().parent.parent


def docs_text() -> str:
    """The README and every page of docs/, in one text: what a user reads, where the tests find the commands
    and code they show."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return "\n\n".join(p.read_text() for p in pages)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def metric_rows(run: Path, *, training: bool = False, timing: bool = True) -> list[dict]:
    """metrics.jsonl of a run: every row, or the training rows only (held-out rows have no reward_mean);
    without `timing`, the keys that differ between identical runs left out."""
    rows = read_jsonl(Path(run) / "metrics.jsonl")
    rows = [r for r in rows if "reward_mean" in r] if training else rows
    return rows if timing else [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def generate(
    model,
    tokenizer,
    prompts,
    group_size=1,
    *,
    max_new_tokens,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    greedy=False,
    seeds=None,
    chat_template=False,
    with_logprobs=False,
):
    """A Rollout of `group_size` completions per prompt, through the trainer's own generator."""
    sampling = SamplerConfig(max_new_tokens, 0 if greedy else temperature, top_p, top_k)
    return HFGenerator(tokenizer, chat_template=chat_template).generate(
        model, list(prompts), group_size, sampling, seeds, with_logprobs=with_logprobs
    )


def floats(metrics: dict) -> dict:
    """policy_loss's metrics (0-d tensors) as Python floats."""
    return {k: float(v) for k, v in metrics.items()}


def wait_for(predicate, timeout: float = 120.0, poll: float = 0.0005) -> bool:
    """Whether `predicate()` came true within `timeout` seconds (polled every `poll`)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return False


def with_batch_sizes(model, fn):
    """(fn(), the batch size of every forward of `model` while it ran): to see a decode batch shrink. Seen at
    the input embedding, which every forward calls once, the model's own and a direct decode step's."""
    seen = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    try:
        return fn(), seen
    finally:
        hook.remove()


# --- padded views of flat data, for tests that state a case as rectangles ------------------------------------


def rollout_from_padded(
    prompts, group_size, input_ids, attention_mask, completion_mask, truncated, sampler_logp=None, **rest
):
    """A flat Rollout from padded rows: `input_ids`/`attention_mask` [B, P+T] (each row's real tokens contiguous: a
    left-padded prompt, then T columns right-padded), `completion_mask` and `sampler_logp` [B, T]."""
    from grpo_cli.samples.rollout import Rollout

    T = completion_mask.shape[1]
    real = attention_mask.bool()
    prompt_ids, after, sampled, logps = [], [], [], []
    for b in range(input_ids.shape[0]):
        n_after = int(real[b, -T:].sum())
        ids = input_ids[b][real[b]].tolist()
        prompt_ids.append(ids[: len(ids) - n_after])
        after.append(ids[len(ids) - n_after :])
        sampled.append(completion_mask[b, :n_after].long().tolist())
        if sampler_logp is not None:
            logps.append(sampler_logp[b, :n_after].tolist())
    truncated = truncated.tolist() if hasattr(truncated, "tolist") else list(truncated)
    return Rollout.of_rows(
        prompts,
        group_size,
        prompt_ids,
        after,
        truncated=truncated,
        sampled=sampled,
        logps=logps if sampler_logp is not None else None,
        device=input_ids.device,
        **rest,
    )


def padded(roll):
    """(input_ids, attention_mask, completion_mask) of a flat rollout: prompts left-padded, what follows them
    right-padded to the longest, the loss mask on those columns."""
    from grpo_cli.models.forward import padded_view

    ids, mask, index, valid = padded_view(roll)
    return ids, mask, torch.where(valid, roll.loss_mask[index], 0).long()


def grid(roll, values):
    """Per-token `values` [N] of a flat rollout on its padded columns after each prompt: [rows, T], 0 where none."""
    from grpo_cli.models.forward import padded_view

    _, _, index, valid = padded_view(roll)
    return torch.where(valid, values[index], torch.zeros((), dtype=values.dtype, device=values.device))


def flat_inputs(logp, old_logp, advantages, mask, **settings):
    """policy_loss's inputs from rectangles: [B, T] per-token tensors and [B] advantages, every cell a token of
    its row (off the mask where `mask` is 0)."""
    from grpo_cli.algo.objective import LossInputs

    B, T = logp.shape
    segments = torch.arange(B).repeat_interleave(T)
    flat = {k: (v.reshape(-1) if isinstance(v, torch.Tensor) and v.shape == (B, T) else v) for k, v in settings.items()}
    return LossInputs(
        logp.reshape(-1),
        old_logp.reshape(-1),
        advantages.repeat_interleave(T),
        mask.reshape(-1),
        segments,
        num_segments=B,
        **flat,
    )


def token_logprobs(
    model,
    input_ids,
    attention_mask,
    completion_len,
    *,
    temperature=1.0,
    with_entropy=False,
    entropy_grad=False,
    chunk_tokens=None,
    packing=False,
):
    """The last `completion_len` tokens of padded rows scored through the package's forward, padded or (with
    `packing`, where the model can) packed in one micro-batch: ([B, T], [B, T] or None), 0 where a row has none."""
    from grpo_cli.models.logprobs import LogProbRequest, can_pack, one_bin, packed_logprobs, padded_logprobs

    request = LogProbRequest(completion_len, temperature, with_entropy or entropy_grad, entropy_grad, chunk_tokens)
    if not (packing and can_pack(model)):
        return padded_logprobs(model, input_ids, attention_mask, request)
    roll, packed = pack_rows(input_ids, attention_mask, completion_len, one_bin=one_bin(model))
    logp, entropy = packed_logprobs(model, packed, request)

    def on_grid(values):  # differentiably, 0 where a row has no token
        out = torch.zeros(roll.tokens.shape, dtype=values.dtype, device=values.device).index_put(
            (packed.index,), values
        )
        return grid(roll, out)

    return on_grid(logp), None if entropy is None else on_grid(entropy)


def pack_rows(input_ids, attention_mask, completion_len, *, one_bin=False):
    """Padded rows (each row's real tokens contiguous, its last `completion_len` columns scored) as a flat rollout
    and one packed micro-batch of it: (rollout, Packed)."""
    from grpo_cli.models.packer import pack, packed_inputs

    B = input_ids.shape[0]
    roll = rollout_from_padded([""] * B, 1, input_ids, attention_mask, attention_mask[:, -completion_len:], [False] * B)
    mb = pack(roll.lengths.tolist(), layout="one_bin" if one_bin else "bins", batch_rows=max(B, 1))[0]
    return roll, packed_inputs(
        roll.tokens, roll.offsets.tolist(), roll.lengths.tolist(), roll.prompt_lengths.tolist(), mb
    )


def scored_cells(packed, offsets, prompt_lengths):
    """(row, column after its prompt) of each token a packed micro-batch scores, from `packed.index`."""
    index = packed.index.cpu()
    starts = torch.tensor(offsets)
    row = torch.searchsorted(starts, index, right=True) - 1
    return row, index - starts[row] - torch.tensor(prompt_lengths)[row]


def on_grid(values, row, col, shape):
    """Flat `values` at (row, col) of a zero tensor of `shape`, differentiably."""
    return values.new_zeros(shape).index_put((row.to(values.device), col.to(values.device)), values)


def from_grid(roll, values):
    """Values on a flat rollout's padded columns after each prompt ([rows, T]) as per-token values [N]."""
    from grpo_cli.models.forward import padded_view

    _, _, index, valid = padded_view(roll)
    out = torch.zeros(roll.tokens.shape, dtype=values.dtype, device=values.device)
    out[index[valid]] = values[valid]
    return out


def refusal(config) -> str:
    """What the config's one check says of a command's config, or of a config group in the default `grpo train`
    config: the sentence, '' when nothing is wrong."""
    from dataclasses import fields, replace

    from grpo_cli.config import TrainConfig, check
    from grpo_cli.errors import GrpoError

    if not hasattr(config, "trainer") and not hasattr(config, "model"):  # a group: put it in a default train config
        name = next(f.name for f in fields(TrainConfig) if isinstance(config, type(getattr(TrainConfig(), f.name))))
        config = replace(TrainConfig(), **{name: config})
    try:
        check(config)
    except GrpoError as e:
        return str(e)
    return ""


def forget_generator(name: str) -> None:
    """Undo a test's register_generator: the registry's entry and the `generator` option it made."""
    from hydra.core.config_store import ConfigStore

    from grpo_cli.generate.base import GENERATORS

    GENERATORS.pop(name)
    ConfigStore.instance().repo["generator"].pop(f"{name}.yaml", None)


def checked(name: str, fn):
    """A plain fn(prompts, completions, answers) with the checks every built-in reward term has."""
    from grpo_cli.rewards import Batch, run_term

    def call(prompts, completions, answers) -> list[float]:
        batch = Batch(list(prompts), list(completions), list(answers))
        return run_term(name, lambda b: fn(b.prompts, b.completions, b.answers), batch, user_code=True)

    return call


def sandbox_runs_here() -> None:
    """Skip, saying why, where the kernel refuses the namespaces the OS sandbox confines code in."""
    from grpo_cli.sandbox import namespaces as sandbox_os

    probe = subprocess.run(
        [sys.executable, "-c", "from grpo_cli.sandbox import namespaces as s; s.namespaces()"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        pytest.skip(f"the kernel refuses namespaces here: {probe.stderr.strip().splitlines()[-1]}")
    assert sandbox_os.NUMBERS  # the filter has a table: a machine without one is refused by the sandbox itself
