"""The line `grpo train` ends with: where the steps' time went, and how far the largest phase is from what
the hardware allows.

Phases, from the metrics rows (seconds per step, summed over the run): generation (the model's sampling;
`gen_s` less the environment's share), environment (episodes' calls between turns, wall time: `env/seconds`),
scoring (advantages and the extra forwards: reference, old log-probs), update (forwards and backwards,
AdamW), push (weights into a generator with its own copy) and wait (the trainer idle while a generation
worker answers the steps asked ahead, before a push). A row's `seconds` is the step's wall time: these
phases and what lies between them.

How it works in detail: docs/internals.md, grpo_cli/run/floors.py.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_cli.config import reference_in_worker
from grpo_cli.models.logprobs import lm_config, text_config
from grpo_cli.models.memory import kv_sizes
from grpo_cli.models.runtime import returned_when_freed

PHASES = ("generation", "environment", "scoring", "update", "push", "wait")


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    return names[0] if names else platform.processor() or platform.machine()


_PROBED: dict[str, tuple[float, float]] = {}


def cached_peaks(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """machine_peaks, probed once per (machine, device, dtype, threads, torch) and kept in the cache file; a
    cache that cannot be read or written is never an error: this process remembers, the next probes again."""
    key = f"{_machine(device)}|{device.type}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"
    key += "|read" if device.type == "cpu" else ""  # a CPU's peaks from before its probe read memory are not used
    path = Path(os.environ.get("GRPO_CLI_CACHE") or Path.home() / ".cache" / "grpo-cli") / "peaks.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), list) and len(cache[key]) == 2:
        return tuple(cache[key])
    if key in _PROBED:  # a cache file that could not be written: probed once per process
        return _PROBED[key]
    from grpo_cli.run.probe import machine_peaks

    with returned_when_freed():  # the probe's buffers leave the process's memory with it
        peaks = _PROBED[key] = machine_peaks(device, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")  # ranks of one machine may write at once
        temporary.write_text(json.dumps({**cache, key: list(peaks)}, indent=1))
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: the next run probes again
    return peaks


def kv_bytes_per_position(model: torch.nn.Module, element_bytes: float) -> float:
    """Bytes one position's keys and values take in every layer's cache, from the (text) config, read through a
    DDP wrapper; 0 where the config does not give its layers, heads and head size."""
    text = text_config(lm_config(model))
    layers, heads = getattr(text, "num_hidden_layers", None), getattr(text, "num_attention_heads", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and heads):
        return 0.0
    kv_heads, head_dim = kv_sizes(text)
    return 2.0 * layers * kv_heads * head_dim * element_bytes


def sampled_runs(roll) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every run of sampled tokens in a rollout (its loss mask's runs of 1: an episode's turns, or a row's one
    completion), in the rows that are real (not a rank's padding): (the tokens before it in its row, its length,
    which of its row's runs it is), each [runs] long."""
    lengths = roll.lengths.cpu()
    sampled = roll.loss_mask.cpu().bool()
    row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    position = torch.arange(len(sampled)) - (lengths.cumsum(0) - lengths)[row]
    if roll.weight is not None:
        sampled = sampled & (roll.weight.cpu() > 0)[row]
    starts = sampled & ~torch.cat([sampled.new_zeros(1), sampled[:-1]]) | sampled & (position == 0)
    ends = sampled & ~torch.cat([sampled[1:], sampled.new_zeros(1)]) | sampled & (position == lengths[row] - 1)
    first, last = starts.nonzero().squeeze(-1), ends.nonzero().squeeze(-1)
    owner = row[first]
    new_row = torch.ones_like(owner, dtype=torch.bool)
    new_row[1:] = owner[1:] != owner[:-1]
    index = torch.arange(len(owner))
    turn = index - torch.cummax(torch.where(new_row, index, 0), 0).values
    return position[first], last - first + 1, turn


def decode_floor(
    contexts: torch.Tensor,
    lengths: torch.Tensor,
    weight_bytes: float,
    kv_bytes: float,
    bandwidth: float,
    token_flops: float,
    flops: float,
) -> float:
    """The roofline of rows decoding together: row r samples lengths[r] tokens after contexts[r] tokens, the first
    from the prefill's logits, each later one from a one-token step over the rows still sampling. Step j reads
    the weights once and, for each such row, the keys and values of its contexts[r] + j positions, and computes
    `token_flops` per row: the longer of its reads at `bandwidth` and its FLOPs at `flops`, summed over steps."""
    if not len(lengths) or int(lengths.max()) < 2:
        return 0.0
    order = lengths.argsort()
    lengths, contexts = lengths[order].double(), contexts[order].double()
    steps = torch.arange(1, int(lengths.max()), dtype=torch.float64)
    done = torch.searchsorted(lengths, steps, right=True)  # rows whose last token came before this step
    live = (len(lengths) - done).double()
    later = torch.cat([contexts.flip(0).cumsum(0).flip(0), contexts.new_zeros(1)])  # contexts of rows from i on
    positions = later[done] + steps * live
    reads = (weight_bytes + kv_bytes * positions) / bandwidth
    return float(torch.maximum(reads, live * token_flops / flops).sum())


@dataclass(frozen=True)
class StepFloors:
    """What a step's floors need (module docstring): the policy's size, the extra forwards and passes the
    config asks for, and this machine's peaks."""

    params: int
    weight_bytes: float
    bandwidth: float
    flops: float
    forwards: int
    passes: int
    group_size: int = 1
    sample_flops: float | None = None  # generation's FLOP/s where it samples in another dtype (generator.weights)
    kv_bytes: float = 0.0  # one position's keys and values in every layer, in the sampling dtype
    ranks: int = 1  # data-parallel ranks: a row's tokens are summed over them, each rank computing its share
    worker_forwards: int = 0  # a generation worker's scoring forwards: the KL reference, when it scores it

    @classmethod
    def of(cls, cfg, policy: torch.nn.Module, precision, ranks: int = 1) -> "StepFloors":
        device = next(policy.parameters()).device
        dtype = precision.frozen_dtype  # what generation reads: bf16 under bf16-mixed (autocast's copies)
        sampled = torch.bfloat16 if getattr(cfg.generator, "weights", "full") == "bf16" else dtype  # generator.weights
        params = sum(p.numel() for p in policy.parameters())
        return cls(
            params,
            params * torch.finfo(sampled).bits / 8,
            *cached_peaks(device, dtype),
            int(cfg.algo.beta != 0 and not reference_in_worker(cfg)) + int(cfg.algo.num_iterations > 1),
            cfg.algo.num_iterations,
            cfg.sampler.group_size,
            cached_peaks(device, sampled)[1] if sampled != dtype else None,
            kv_bytes_per_position(policy, torch.finfo(sampled).bits / 8),
            ranks,
            int(cfg.algo.beta != 0 and reference_in_worker(cfg)),
        )

    def floors(self, rows: list[dict], forwards: int | None = None) -> dict[str, float | None]:
        """floor_seconds of these rows at this run's sizes and peaks (`forwards`: scoring's, default the trainer's)."""
        return floor_seconds(
            rows,
            self.params,
            self.weight_bytes,
            self.bandwidth,
            self.flops,
            self.forwards if forwards is None else forwards,
            self.passes,
            self.group_size,
            sample_flops=self.sample_flops,
            ranks=self.ranks,
        )

    def generation_floor(self, roll) -> float:
        """The rollout's generation floor (module docstring): each turn's decode roofline and the prompts' prefill."""
        flops = self.sample_flops or self.flops
        contexts, lengths, turns = sampled_runs(roll)
        decode = sum(
            decode_floor(
                contexts[turns == k],
                lengths[turns == k],
                self.weight_bytes,
                self.kv_bytes,
                self.bandwidth,
                2 * self.params,
                flops,
            )
            for k in turns.unique().tolist()
        )
        firsts = roll.prompt_lengths.cpu()[:: roll.group_size]  # each group's prompt, prefilled once
        if roll.weight is not None:  # not a rank's padding groups
            firsts = firsts[roll.weight.cpu().view(-1, roll.group_size).amax(1) > 0]
        return decode + 2 * self.params * int(firsts.sum()) / flops

    def efficiency(self, row: dict, roll=None, all_max=None) -> dict[str, float]:
        """`efficiency/<phase>`: the phase's floor over its measured seconds in this row, and with the step's rollout,
        generation's floor from it (`gen_floor_s`). A generation worker's rows (they carry `wait_s`: their gen_s is
        the trainer's wait) take generation's and scoring's seconds from what the worker measured
        (`worker/gen_s`, `worker/score_s`), and scoring's floor from the forwards it runs. `all_max`
        (Dist.all_max; every rank calls it) makes that floor the largest rank's: the row's gen_s is the slowest
        rank's, and that rank's rollout is not this one."""
        gen_floor = self.generation_floor(roll) if roll is not None and len(roll.lengths) else None
        if all_max is not None:
            gen_floor = all_max(-1.0 if gen_floor is None else gen_floor)
            gen_floor = None if gen_floor < 0 else gen_floor
        out = {"gen_floor_s": gen_floor} if gen_floor is not None else {}
        forwards: int | None = None
        phases: tuple[str, ...] = ("generation", "scoring", "update")
        if "wait_s" in row:  # the worker's own seconds; none logged (an older row): the update's alone
            worker = {"gen_s": row.get("worker/gen_s"), "score_s": row.get("worker/score_s")}
            row = {**row, **{k: v for k, v in worker.items() if v is not None}}
            forwards, phases = self.worker_forwards, ("update",) if worker["gen_s"] is None else phases
        floor = self.floors([{**row, **out}], forwards)
        spent = phase_seconds([row])
        out.update({f"efficiency/{p}": f / spent[p] for p in phases if (f := floor[p]) is not None and spent[p] > 0})
        return out


def phase_seconds(rows: list[dict]) -> dict[str, float]:
    """Each phase's seconds, summed over the rows."""
    total = {p: 0.0 for p in PHASES}
    for r in rows:
        env = r.get("env/seconds", 0.0)
        total["generation"] += max(r.get("gen_s", 0.0) - env, 0.0)
        total["environment"] += env
        total["scoring"] += r.get("score_s", 0.0)
        total["update"] += r.get("update_s", 0.0)
        total["push"] += r.get("push_s", 0.0)
        total["wait"] += r.get("wait_s", 0.0)
    return total


def floor_seconds(
    rows: list[dict],
    params: int,
    weight_bytes: float,
    bandwidth: float,
    flops: float,
    forwards: int,
    passes: int,
    group_size: int = 1,
    *,
    sample_flops: float | None = None,
    ranks: int = 1,
) -> dict[str, float | None]:
    """Each phase's floor, summed over the rows (module docstring); None where there is none. `sample_flops`:
    generation's FLOP/s where it computes in another dtype than the update (default `flops`). `ranks`: the
    data-parallel ranks the rows' token counts are summed over, each computing its share at the peaks given
    (a rank's); `gen_floor_s` is already a rank's."""
    sample_flops = sample_flops or flops
    gen = score = update = 0.0
    for r in rows:
        prompt, completion = r.get("prompt_tokens", 0.0), r.get("completion_tokens", 0.0)
        forward = r.get("forward_tokens", prompt + completion) / ranks  # fewer with shared prompts (each once)
        prompt, completion = prompt / ranks, completion / ranks  # a rank's share
        # generation prefills each distinct prompt once for its group (generation.prefill)
        if "gen_floor_s" in r:  # the rollout's roofline (StepFloors.generation_floor)
            gen += r["gen_floor_s"]
        else:
            decode = max(
                r.get("completion_len_max", 0.0) * weight_bytes / bandwidth, 2 * params * completion / sample_flops
            )
            gen += decode + 2 * params * prompt / group_size / sample_flops
        score += forwards * 2 * params * forward / flops
        update += passes * 6 * params * forward / flops
    return {
        "generation": gen,
        "environment": None,
        "scoring": score if forwards else None,
        "update": update,
        "push": None,
        "wait": None,
    }


def bottleneck_line(rows: list[dict], floors: StepFloors) -> str | None:
    """One line: each phase's share of the steps' time, and the largest phase against its floor."""
    spent = phase_seconds(rows)
    total = sum(spent.values())
    if not rows or total <= 0:
        return None
    shares = ", ".join(
        f"{p} {s / total:.0%}" for p, s in sorted(spent.items(), key=lambda kv: -kv[1]) if s / total >= 0.005
    )
    top = max(spent, key=lambda p: spent[p])
    line = f"time: {shares} of {total / len(rows):.2f} s per step"
    f = floors
    floor = f.floors(rows)[top]
    if floor is None or floor <= 0:
        return f"{line}; {top} is the largest, and has no floor here (module docstring: grpo_cli/run/floors.py)."
    sampled = top == "generation" and f.sample_flops is not None  # generator.weights=bf16: bf16's FLOP/s
    flops = (
        f"{(f.sample_flops if sampled and f.sample_flops else f.flops) / 1e9:.0f} GFLOP/s{' (bf16)' if sampled else ''}"
    )
    return (
        f"{line}; the largest, {top}, is {spent[top] / floor:.1f}x its floor, efficiency {floor / spent[top]:.2f} "
        f"({spent[top] / len(rows):.3f} s per step against {floor / len(rows):.4f} s at the {f.bandwidth / 1e9:.0f} "
        "GB/s "
        f"and {flops} measured here; no activations or attention FLOPs counted, so a small model's ratio is overhead)."
    )
