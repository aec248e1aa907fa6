"""Generation with vLLM, colocated in the training process (`generator=vllm`).

The engine is a second copy of the sampling weights, in the compute dtype, that vLLM's kernels and
paged KV cache serve. It is built from the model's config alone (`load_format="dummy"`, no file is
read) and every weight is pushed into it from the model in memory, so the same code serves the policy
at step 0, a resumed run, a LoRA policy (its adapter merged into the pushed weights: W + s * B @ A,
the policy itself untouched) and a checkpoint in `grpo evaluate` / `grpo sample`.

How it works in detail: docs/internals.md, grpo_cli/generate/vllm.py.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import warnings
from typing import Any

import numpy as np
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import VLLM_INSTALL
from grpo_cli.generate.hf import PromptIds, assemble, eos_token_ids
from grpo_cli.models.precision import Precision
from grpo_cli.samples.rollout import Rollout


def import_vllm():
    """vLLM, set up to run inside this process and to leave this process's CPU threads alone."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # an in-process engine: weights pushed by reference
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # CPU: do not pin the trainer's threads
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up notes; VLLM_LOGGING_LEVEL=INFO shows them
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    # vLLM's own deprecation notes about torch APIs it calls: nothing a user of this tool can act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    try:
        import vllm
    except ImportError:
        raise GrpoError(VLLM_INSTALL) from None
    return vllm


def _base(model):
    """The plain causal LM inside a PEFT wrapper (with its LoRA layers), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _whole(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter: under FSDP2 a parameter stays a sharded DTensor even while the
    module is unsharded, so it is gathered (a collective: every rank pushes at the same points)."""
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _lora_layers(model) -> dict[str, torch.nn.Module]:
    return {
        name: m for name, m in _base(model).named_modules() if hasattr(m, "lora_A") and hasattr(m, "get_base_layer")
    }


@torch.no_grad()
def full_weights(model):
    """(name, tensor) of every parameter of the plain causal LM, named as in its checkpoint: under LoRA
    each adapted weight is W + scale * B @ A for the active adapters (none while adapters are off),
    computed aside, so the policy's own tensors are not touched."""
    base, layers = _base(model), _lora_layers(model)
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, _whole(p)
            continue
        owner, leaf = name.split(".base_layer.", 1)
        layer, tensor = layers[owner], _whole(p)
        if leaf == "weight" and not layer.disable_adapters and not layer.merged:
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    tensor = tensor + _whole(layer.get_delta_weight(adapter)).to(tensor.dtype)
        yield f"{owner}.{leaf}", tensor


def _reprocess_tied_head(model) -> None:
    """A tied LM head loads no weights of its own (they are the embedding's), so the reload leaves its
    processed form (on CPU a packed GEMM weight) as it was: build it again from the new embedding."""
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(model.config, "tie_word_embeddings", False) and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


def fingerprint(model) -> tuple:
    """What identifies the weights `model` would push now: each parameter's identity and in-place version,
    and whether LoRA adapters are switched off."""
    return (
        tuple((id(p), p._version) for p in model.parameters()),
        tuple(layer.disable_adapters for layer in _lora_layers(model).values()),
    )


def sampling_params(
    sampling: SamplerConfig, seeds: list[int] | None, count: int, n: int, eos: list[int], with_logprobs: bool
):
    """vLLM's SamplingParams for `count` requests of `n` samples each, seeded per request: exactly the
    tempered softmax (with top-k / top-p) the trainer scores, stopped at any EOS id, ids not text."""
    from vllm import SamplingParams

    common = dict(
        n=n,
        max_tokens=sampling.max_new_tokens,
        stop_token_ids=eos,
        detokenize=False,
        skip_special_tokens=False,
        logprobs=0 if with_logprobs else None,
    )
    if sampling.greedy:
        return [SamplingParams(temperature=0.0, **common)] * count
    return [
        SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, seed=int(seed), **common
        )
        for seed in seeds or []
    ]


class VLLMGenerator(PromptIds):
    """`generator.generate(model, prompts, group_size, sampling, seeds) -> Rollout`, as HFGenerator, with a
    vLLM engine holding the sampling weights (see the module docstring)."""

    returns_logprobs = True  # vLLM's own log-probs of every sampled token: the step's sampler_logp
    needs_weights = True  # the step gathers (FSDP) and pushes the policy after each update

    def __init__(
        self,
        tokenizer,
        settings,
        *,
        chat_template: bool = False,
        precision: Precision | None = None,
        device: torch.device | None = None,
        world_size: int = 1,
        seed: int = 0,
    ):
        super().__init__(tokenizer, chat_template)
        self.settings = settings
        self.precision = precision or Precision("fp32")
        self.device = torch.device(device or "cpu")
        self.world_size, self.seed = world_size, seed
        self.llm: Any = None  # vllm.LLM, built at the first generate
        self._pushed: tuple | None = None  # the fingerprint of the weights last pushed
        self._asleep = False
        self.push_seconds = 0.0  # total time spent pushing weights (for benchmarks)

    # -- the engine -------------------------------------------------------------------------------
    def _build(self, model) -> None:
        vllm = import_vllm()
        s = self.settings
        config = _base(model).config
        dtype = self.precision.frozen_dtype  # the compute dtype: bf16 under bf16-mixed
        cuda = self.device.type == "cuda"
        kwargs = dict(
            dtype=dtype,
            seed=self.seed,
            load_format="dummy",
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            enforce_eager=s.enforce_eager or not cuda,
            max_model_len=s.max_model_len or getattr(config, "max_position_embeddings", None),
            enable_prefix_caching=True,  # a group's G requests share the prompt's KV blocks
        )
        if cuda:
            kwargs.update(gpu_memory_utilization=s.gpu_memory_utilization, enable_sleep_mode=s.sleep)
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
        else:
            kwargs.update(kv_cache_memory_bytes=int(s.kv_cache_gib * 2**30))
        if self.world_size > 1:
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        with tempfile.TemporaryDirectory(prefix="grpo-vllm-") as d:
            # vLLM needs a directory to read the architecture from: the config and tokenizer, no weights.
            config.save_pretrained(d)
            self.tokenizer.save_pretrained(d)
            # An in-process engine seeds the global generators with its seed: keep the run's own state
            # (a resumed run's restored RNG must not depend on when the engine was built).
            states = (
                random.getstate(),
                np.random.get_state(),
                torch.get_rng_state(),
                torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            )
            try:
                self.llm = vllm.LLM(model=d, **kwargs)
            except (ValueError, NotImplementedError) as e:  # an architecture, setting or memory size vLLM refuses
                raise GrpoError(
                    f"vLLM could not start an engine for this model ({str(e).splitlines()[0]}); adjust "
                    "generator.max_model_len, generator.kv_cache_gib (CPU) or generator.gpu_memory_utilization "
                    "(CUDA), or use generator=hf."
                ) from None
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
                torch.set_rng_state(states[2])
                if states[3] is not None:
                    torch.cuda.set_rng_state_all(states[3])

    def close(self) -> None:
        """Shut the engine down (vLLM tears down its process groups, and torch.distributed's default one)."""
        if self.llm is not None:
            llm, self.llm, self._pushed = self.llm, None, None
            llm.llm_engine.engine_core.shutdown()

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def sleep(self) -> None:
        """Free the engine's device memory while the update runs (CUDA sleep mode); a no-op elsewhere."""
        if self.llm is not None and self.device.type == "cuda" and self.settings.sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def update(self, model) -> None:
        """Push `model`'s weights now (after an optimizer step)."""
        if self.llm is not None:
            self._push(model)

    def _push(self, model) -> None:
        import time

        t = time.perf_counter()
        self._wake()
        weights = full_weights(model)  # streamed: a merged LoRA weight or a gathered shard lives one at a time
        # vLLM's in-place reload: each layer's weights are loaded, then processed into the kernel's form
        # (fused qkv / gate-up, the CPU backend's packed GEMM weights) and copied into the old storage.
        # The rotary embedding (no weights) and a tied LM head (the embedding's, re-processed below)
        # report "failed to load" at every push: expected, so not shown.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.apply_model(_reprocess_tied_head)
        self.llm.reset_prefix_cache()  # cached prompt blocks were computed with the old weights
        self._pushed = fingerprint(model)
        self.push_seconds += time.perf_counter() - t

    def engine(self, model):
        """The vLLM engine holding `model`'s current weights."""
        if self.llm is None:
            self._build(model)
        self._wake()
        if self._pushed != fingerprint(model):
            self._push(model)
        return self.llm

    # -- generation -------------------------------------------------------------------------------
    def generate(
        self,
        model,
        prompts: list[str],
        group_size: int,
        sampling: SamplerConfig,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = True,
    ) -> Rollout:
        """`group_size` completions of each prompt, with the sampling log-probs in roll.sampler_logp."""
        from vllm.inputs import TokensPrompt

        prompts = list(prompts)
        seeds = self.group_seeds(prompts, sampling, seeds)
        prompt_ids = self.encode(prompts)
        eos = eos_token_ids(model, self.tokenizer)
        llm = self.engine(model)
        # Greedy completions of a prompt are all the same: vLLM makes one (it refuses n > 1), repeated G times.
        n = 1 if sampling.greedy else group_size
        params = sampling_params(sampling, seeds, len(prompts), n, eos, with_logprobs)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
        rows = [
            c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index) for _ in range(group_size // n)
        ]
        width = max([len(c.token_ids) for c in rows] + [0])
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        logps = torch.zeros((len(rows), width) if with_logprobs else (0,))  # filled only with_logprobs
        for i, c in enumerate(rows):
            ids[i, : len(c.token_ids)] = torch.tensor(c.token_ids, dtype=torch.long)
            if with_logprobs:
                logps[i, : len(c.token_ids)] = torch.tensor(
                    [entry[token].logprob for token, entry in zip(c.token_ids, c.logprobs)]
                )
        truncated = torch.tensor([c.finish_reason == "length" for c in rows], dtype=torch.bool)
        device = next(model.parameters()).device
        return assemble(
            prompts,
            prompt_ids,
            group_size,
            ids.to(device),
            eos,
            self.tokenizer,
            logps.to(device) if with_logprobs else None,
            truncated=truncated.to(device),
        )

    def complete(
        self,
        model,
        contexts: list[list[int]],
        sampling: SamplerConfig,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = True,
    ):
        """One continuation of each context's token ids (an episode so far; episodes/driver.py), seeded per row, as
        HFGenerator.complete: [(ids up to and including EOS, sampling log-probs or None, ended with EOS)]."""
        from vllm.inputs import TokensPrompt

        eos = eos_token_ids(model, self.tokenizer)
        llm = self.engine(model)
        params = sampling_params(sampling, seeds, len(contexts), 1, eos, with_logprobs)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in contexts], params, use_tqdm=False)
        out = []
        for o in outputs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            logps = [entry[t].logprob for t, entry in zip(ids, c.logprobs)] if with_logprobs else None
            out.append((ids, logps, c.finish_reason != "length"))
        return out
