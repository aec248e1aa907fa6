"""Generation behind one small interface that training, held-out evaluation, `grpo evaluate` and
`grpo sample` share: `generator.generate(model, prompts, group_size, sampling, seeds) -> Rollout`,
`generator.update(model)` after an optimizer step and `generator.sleep()` while the update runs.
The `generator` config group picks `hf` (here), `vllm` (vllm.py) or a registered back-end
(base.py, which builds it).

How it works in detail: docs/internals.md, grpo_cli/generate/hf.py.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from grpo_cli.config import SamplerConfig
from grpo_cli.data.prompts import encode_prompts
from grpo_cli.errors import GrpoError
from grpo_cli.generate.packed import float32_attention, has_packable, packed_linears, packing_helps
from grpo_cli.generate.sampling import Noise, picker
from grpo_cli.generate.steps import cache_kwarg, decode_steps, distinct_rows, left_pad
from grpo_cli.models.precision import Precision, decode_ratio
from grpo_cli.samples.rollout import Rollout

if TYPE_CHECKING:
    from grpo_cli.generate.turn_cache import TurnCache

# How often decoding reads the rows' end-of-sequence flags on a GPU: each read makes the host wait for the GPU,
# so read every token the host could not queue the next token's work while the GPU runs this one. A row
# that ended meanwhile samples a few tokens more, never read (what a row holds after its EOS is arbitrary).
# On a CPU there is nothing to overlap: every token.
READ_EOS_EVERY = 8


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every end-of-sequence id the model's generation config lists (e.g. <|im_end|> and <|endoftext|>),
    and the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = list(ids) if isinstance(ids, (list, tuple)) else [ids]
    ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids if i is not None})


def prefill_rows(model, prompt_ids: list[list[int]], group_size: int, pad_id: int):
    """Each distinct prompt's forward once: (cache, [rows, vocab] next-token logits, [rows, width] attention mask,
    [rows] next position, `source`), the cache holding one row per distinct prompt and `source` each decode row's
    row of it (None when they are the same rows), so the decode's steps copy it to their rows once."""
    device = next(model.parameters()).device
    firsts, rows_of = distinct_rows(prompt_ids)  # each distinct prompt runs once
    ids, mask = left_pad([list(prompt_ids[i]) for i in firsts], pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache, logits, source = getattr(out, cache_kwarg(model)), out.logits[:, -1], None
    if len(firsts) < len(prompt_ids) or group_size > 1:  # a prompt on several rows: its G samples, its twins
        source = torch.tensor(rows_of, device=device).repeat_interleave(group_size)
        logits, mask, positions = logits[source], mask[source], positions[source]
    return cache, logits, mask, positions[:, -1] + 1, source


def prefill(model, prompt_ids: list[list[int]], group_size: int, pad_id: int, turns: TurnCache | None):
    """prefill_rows, or under a session (`turns`) each row from its kept prefix where it has one."""
    found = turns.lookup(prompt_ids) if turns is not None and group_size == 1 else None
    if found and any(found):
        from grpo_cli.generate.turn_cache import prefill_after

        return (*prefill_after(model, prompt_ids, found, pad_id, cache_kwarg(model)), None)
    return prefill_rows(model, prompt_ids, group_size, pad_id)


def keep_rows(
    turns: TurnCache, stepper, local: list[int], host_rows, prompt_ids, tokens: Tensor, fed: int, eos
) -> None:
    """A session keeps these decode rows (`local`, positions in the live batch), `fed` tokens decoded: each row's
    context and sampled tokens, and their keys and values (turn_cache.py). A group of one: row r is prompt r."""
    from grpo_cli.generate.turn_cache import kept_length, row_kv

    layers, held = stepper.held()
    for i in local:
        r = int(host_rows[i])
        context, kept = prompt_ids[r], kept_length(tokens[r], fed, eos)
        turns.store(context, tokens[r, :kept].tolist(), row_kv(layers, held[i], i, len(context) + kept))


@torch.no_grad()
def decode(
    model,
    prompt_ids: list[list[int]],
    group_size: int,
    sampling: SamplerConfig,
    *,
    eos_ids: list[int],
    pad_id: int,
    seeds: list[int] | None = None,
    with_logprobs: bool = False,
    steps: str = "eager",
    read_eos_every: int | None = None,
    turns: TurnCache | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`group_size` completions of each prompt: ([n*G, T'] ids, arbitrary after a row's EOS (assemble and
    continuations cut there); [n*G, T'] sampling log-probs under the distribution each token was drawn from,
    tempered and, under top-k or top-p, renormalised over the kept set; or None). T' <= max_new_tokens: the
    batch stops once every row has ended, seen every `read_eos_every` tokens (READ_EOS_EVERY on a GPU, 1 on a
    CPU). `steps`: the kind of decode steps (decode_steps). `turns`: a session's kept rows (turn_cache.py),
    which the prefill starts from and every decoded row is kept in."""
    device = next(model.parameters()).device
    n, G, T = len(prompt_ids), group_size, sampling.max_new_tokens
    every = read_eos_every or (1 if device.type == "cpu" else READ_EOS_EVERY)
    cache, logits, mask, position, source = prefill(model, prompt_ids, G, pad_id, turns)
    stepper = decode_steps(model, cache, mask, position, T, steps, source) if T > 1 else None
    del cache, mask, position, source  # the steps hold what they need: a static cache frees the prefill's
    B, eos = n * G, torch.tensor(eos_ids, device=device)
    assert sampling.greedy or seeds is not None, "sampling draws from each group's seed"
    noise = None if sampling.greedy else Noise(seeds or [], G, logits.shape[-1], device, T)
    pick, settings = picker(steps == "compiled"), (sampling.temperature, sampling.top_k, sampling.top_p)
    tokens = torch.full((B, T), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((B, T) if with_logprobs else (0,), device=device)  # filled only with_logprobs
    rows = torch.arange(B, device=device)  # original index of each live row
    host_rows = rows.cpu()  # the same, on the host: what the noise reads
    done = torch.zeros(B, dtype=torch.bool, device=device)  # each live row's: it has sampled an EOS

    keeping = turns is not None and G == 1 and stepper is not None
    for t in range(T):
        chosen, logp = pick(logits, None if noise is None else noise(host_rows), *settings, with_logprobs)
        tokens[rows, t] = chosen
        if logp is not None:
            logps[rows, t] = logp
        done |= torch.isin(chosen, eos)  # a row that ended stays ended, whatever it draws after its EOS
        if t + 1 == T:
            break
        assert stepper is not None  # T > 1
        if (t + 1) % every == 0:
            live = ~done.cpu()  # the host's one read of the GPU, as any sampler that stops early
            n_live = int(live.sum())
            if n_live == 0:
                break
            if n_live <= stepper.drop_at * live.numel():  # finished rows leave the batch
                if turns is not None and keeping:
                    keep_rows(
                        turns, stepper, (~live).nonzero().squeeze(-1).tolist(), host_rows, prompt_ids, tokens, t, eos
                    )
                host_keep = live.nonzero().squeeze(-1)
                keep = host_keep.to(device)
                stepper.keep(keep)
                host_rows, rows, done, chosen = host_rows[host_keep], rows[keep], done[keep], chosen[keep]
        logits = stepper.step(chosen)
    else:
        return tokens[:, :0], None  # max_new_tokens = 0
    if turns is not None and keeping:
        keep_rows(turns, stepper, list(range(len(host_rows))), host_rows, prompt_ids, tokens, t, eos)
    return tokens[:, : t + 1], (logps[:, : t + 1] if with_logprobs else None)


def assemble(
    prompts: list[str],
    prompt_ids: list[list[int]],
    group_size: int,
    completion_ids: Tensor,
    eos_ids: list[int],
    tokenizer,
    logprobs: Tensor | None = None,
    truncated: Tensor | None = None,
) -> Rollout:
    """The flat Rollout of sampled completions ([rows, T'] ids, each cut after its first EOS), with their text.
    `truncated` (the engine's finish reason) defaults to: no EOS among the tokens."""
    rows = continuations(completion_ids, logprobs, eos_ids)
    if completion_ids.shape[1] == 0:  # nothing generated: an immediate stop, one end-of-sequence token each
        rows = [([eos_ids[0]], [0.0] if logprobs is not None else None, True) for _ in rows]
    after = [ids for ids, _, _ in rows]
    cut = [not ended for _, _, ended in rows] if truncated is None else truncated.tolist()
    return Rollout.of_rows(
        prompts,
        group_size,
        [p for p in prompt_ids for _ in range(group_size)],
        after,
        truncated=cut,
        logps=None if logprobs is None else [lp for _, lp, _ in rows],
        device=completion_ids.device,
        completions=tokenizer.batch_decode(after, skip_special_tokens=True),
        pad_token_id=tokenizer.pad_token_id,
    )


def completion_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row never reached one."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [B, T]
    has_eos = is_eos.any(dim=1)
    T = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]
    return mask.long(), ~has_eos


def continuations(tokens: Tensor, logps: Tensor | None, eos_ids: list[int]):
    """Rows of generated ids cut after their first EOS: [(ids, log-probs or None, ended with EOS)]."""
    if tokens.shape[1] == 0:
        return [([], [] if logps is not None else None, False) for _ in range(tokens.shape[0])]
    mask, no_eos = completion_mask(tokens, eos_ids)
    lengths = mask.sum(1).tolist()
    ended = (~no_eos).tolist()
    rows, lps = tokens.tolist(), logps.tolist() if logps is not None else None
    return [(rows[i][:n], lps[i][:n] if lps is not None else None, bool(ended[i])) for i, n in enumerate(lengths)]


class PromptIds:
    """What every generator shares: each prompt tokenized once per run, and one seed per group."""

    def __init__(self, tokenizer, chat_template: bool):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self._ids: dict[str, list[int]] = {}

    def encode(self, prompts: list[str]) -> list[list[int]]:
        new = [p for p in dict.fromkeys(prompts) if p not in self._ids]
        if new:
            self._ids.update(zip(new, encode_prompts(self.tokenizer, new, self.chat_template)))
        return [self._ids[p] for p in prompts]

    @staticmethod
    def group_seeds(prompts: list[str], sampling: SamplerConfig, seeds: list[int] | None) -> list[int] | None:
        """`seeds` checked (one per prompt), or drawn from torch's global generator when sampling."""
        if seeds is None and not sampling.greedy:
            seeds = torch.randint(2**62, (len(prompts),)).tolist()
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one seed per prompt (its group's).")
        return seeds


def bf16_sampling(device: torch.device) -> Precision:
    """generator.weights=bf16: the training rollouts sampled under bf16 autocast, whose cache casts each weight
    once per generation (half the bytes each decoded token reads); one sentence where a decode-shaped
    product in bf16 is slower here than in fp32 (a CPU without native bf16 emulates it)."""
    ratio = decode_ratio(device)
    if ratio > 1.0:
        raise GrpoError(
            f"generator.weights=bf16 would sample slower than fp32 on this {device.type} (a decode-shaped "
            f"bf16 product took {ratio:.1f}x fp32's time); set generator.weights=full."
        )
    return Precision("bf16-mixed", device.type)


class HFGenerator(PromptIds):
    """Generation with the model's own forward (see the module docstring). The model is passed per
    call (the policy, or a behaviour policy), so there are no weights to push after an update."""

    # sampling log-probs only when asked (with_logprobs: algo.sampler_correction, or top-k/top-p sampling)
    returns_logprobs = False
    needs_weights = False  # generation reads the model passed in; nothing to push after an update

    def __init__(
        self,
        tokenizer,
        settings=None,
        *,
        chat_template: bool = False,
        precision: Precision | None = None,
        device=None,
        **_placement,
    ):
        super().__init__(tokenizer, chat_template)
        self.precision = precision or Precision("fp32")
        self.steps = getattr(settings, "decode", "auto") if settings is not None else "auto"
        self.matmul = getattr(settings, "matmul", "auto") if settings is not None else "auto"
        self.turns: TurnCache | None = None  # a session's kept rows (session())
        self.sampling_precision = self.precision
        if getattr(settings, "weights", "full") == "bf16" and not self.precision.mixed:
            self.sampling_precision = bf16_sampling(torch.device(device or "cpu"))
            self.returns_logprobs = True  # the sampler's own log-probs: the update measures and corrects the gap

    def generate(
        self,
        model,
        prompts: list[str],
        group_size: int,
        sampling: SamplerConfig,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = False,
    ) -> Rollout:
        """`group_size` completions of each prompt; `seeds` (one per prompt) fix each group's sampling
        noise, and default to draws from torch's global generator."""
        prompts = list(prompts)
        seeds = self.group_seeds(prompts, sampling, seeds)
        prompt_ids = self.encode(prompts)
        eos = eos_token_ids(model, self.tokenizer)
        completion_ids, logps = self._decode(model, prompt_ids, group_size, sampling, seeds, with_logprobs, eos)
        return assemble(prompts, prompt_ids, group_size, completion_ids, eos, self.tokenizer, logps)

    def complete(
        self,
        model,
        contexts: list[list[int]],
        sampling: SamplerConfig,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = False,
    ) -> list[tuple[list[int], list[float] | None, bool]]:
        """One continuation of each context (token ids, e.g. an episode so far; episodes/driver.py), seeded per row:
        (its ids up to and including EOS, their sampling log-probs or None, whether it ended with EOS)."""
        eos = eos_token_ids(model, self.tokenizer)
        tokens, logps = self._decode(model, contexts, 1, sampling, seeds, with_logprobs, eos, self.turns)
        return continuations(tokens, logps, eos)

    @contextmanager
    def session(self):
        """Within it, `complete` keeps every decoded row's keys and values and starts the next call's rows
        from them (turn_cache.py): an episode's turn prefills only what the environment added. Open for one
        `generate` of episodes: the kept cache belongs to the weights it was computed with."""
        from grpo_cli.generate.turn_cache import TurnCache

        self.turns = TurnCache()
        try:
            yield self.turns
        finally:
            self.turns = None

    def _decode(
        self,
        model,
        ids: list[list[int]],
        group_size: int,
        sampling: SamplerConfig,
        seeds,
        with_logprobs: bool,
        eos: list[int],
        turns: TurnCache | None = None,
    ):
        """decode() in eval mode (so no gradient checkpointing, which would turn the cache off) under the
        run's autocast, the model's mode restored after."""
        was_training = model.training
        model.eval()
        precision = self.sampling_precision if with_logprobs else self.precision  # held-out scoring: as trained
        dtype = self._packs(model, precision)
        packed = packed_linears(model, len(ids) * group_size, dtype) if dtype else nullcontext()
        cpu_bf16 = precision.mixed and next(model.parameters()).device.type == "cpu"
        try:
            with precision.autocast(), packed, float32_attention(model) if cpu_bf16 else nullcontext():
                return decode(
                    model,
                    ids,
                    group_size,
                    sampling,
                    eos_ids=eos,
                    pad_id=self.tokenizer.pad_token_id,
                    seeds=seeds,
                    with_logprobs=with_logprobs,
                    steps=self.steps,
                    turns=turns,
                )
        finally:
            model.train(was_training)

    def _packs(self, model, precision: Precision) -> torch.dtype | None:
        """The dtype this decode multiplies packed weights in (generator.matmul; grpo_cli/generate/packed.py), or
        None: a model with large enough float32 linear layers, packed in bf16 under bf16 autocast, on a CPU
        where that is faster, unless `packed` asks for it regardless; never in a dtype this CPU's oneDNN lacks."""
        dtype = torch.bfloat16 if precision.mixed else torch.float32
        if self.matmul == "plain" or not has_packable(model, dtype):
            return None
        helps = self.matmul == "packed" or packing_helps(next(model.parameters()).device, dtype)
        return dtype if helps else None

    def update(self, model) -> None:
        """Nothing to do: generation reads the model's current weights."""

    def sleep(self) -> None:
        """Nothing to free: there is no second copy of the weights."""

    def close(self) -> None:
        """Nothing to shut down."""
