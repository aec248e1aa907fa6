"""The `generator` group: what samples. Its option picks a back-end (generate/base.py's registry), and with it the
back-end's own settings, declared as a subclass of `GeneratorConfig`: `generator=vllm generator.decode=static` is
refused as an unknown key, not ignored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_cli.config.declare import MAX_TIMEOUT_S, Settings, rule, setting


@dataclass
class GeneratorConfig(Settings):
    """The keys every back-end has: its name, and the generation worker's (trainer.max_staleness > 0, or
    generator.worker: a process of its own with its own model copy, the policy's weights pushed after each update)."""

    name: str = setting(
        "hf", "the back-end; choose it with generator=NAME", choices="grpo_cli.generate.base:GENERATORS"
    )
    worker: bool = setting(
        False, "generate in a worker process even at trainer.max_staleness=0 (then one step after the other)"
    )
    device: Optional[str] = setting(
        None,
        "the worker's device (cuda:1; under torchrun cuda:N puts local rank r's "
        "worker on cuda:N+r); null = the trainer's",
    )
    threads: int = setting(0, "the worker's torch CPU threads; 0 = trainer.threads", low=0)
    timeout_s: float = setting(
        600.0,
        "seconds the worker may take to answer (a step's generation, a weight push) before the run stops",
        low=0,
        above=True,
        high=MAX_TIMEOUT_S,
    )
    score_reference: bool = setting(
        True,
        "the worker also scores the KL reference (algo.beta != 0) of what it "
        "samples, so the trainer holds no reference copy",
    )


@dataclass
class HFGeneratorConfig(GeneratorConfig):
    """Generation with the model's own forward and KV cache (generate/hf.py): the default, and the faster choice
    on a CPU."""

    decode: str = setting(
        "auto",
        "the one-token steps: static (a static KV cache, CUDA graphs on CUDA) | compiled (static, its "
        "kernels fused by torch.compile) | direct (the layers over a cache with room) | eager | auto (static on "
        "CUDA, else direct)",
        choices=("auto", "static", "compiled", "direct", "eager"),
    )
    matmul: str = setting(
        "auto",
        "a CPU's decode: packed (oneDNN-packed weights) | plain (torch's product) | auto "
        "(packed where it measures faster)",
        choices=("auto", "packed", "plain"),
    )
    weights: str = setting(
        "full",
        "bf16: sample the rollouts in bf16 (the gap measured: sampler/logp_diff); refused "
        "where this CPU's bf16 is slower than fp32",
        choices=("full", "bf16"),
    )


@dataclass
class VLLMGeneratorConfig(GeneratorConfig):
    """Generation with a vLLM engine colocated in the training process (generate/vllm.py), the sampling weights
    pushed into it after every update: pip install 'grpo-cli[vllm]' (CUDA); `make vllm-env` on a CPU."""

    name: str = setting(
        "vllm", "the back-end; choose it with generator=NAME", choices="grpo_cli.generate.base:GENERATORS"
    )
    gpu_memory_utilization: float = setting(
        0.3, "CUDA: share of the GPU for the engine's weights and KV cache", low=0, above=True, high=1
    )
    kv_cache_gib: float = setting(1.0, "CPU: KV cache size in GiB", low=0, above=True)
    max_model_len: Optional[int] = setting(
        None, "longest prompt + completion the engine serves; null = the model's own", low=1
    )
    sleep: bool = setting(True, "CUDA: free the engine's GPU memory while the update runs (vLLM sleep mode)")
    enforce_eager: bool = setting(False, "CUDA: no CUDA graphs (less memory and start-up time, slower decoding)")


@rule("generator.name", "model.lora.quantize")
def _vllm_serves_no_4bit_base(p, c) -> None:
    p.need(
        not (isinstance(c.generator, VLLMGeneratorConfig) and c.model.lora.quantize),
        "generator=vllm cannot serve a 4-bit QLoRA base (model.lora.quantize); use generator=hf or a LoRA run "
        "without quantize",
    )


@rule("generator.name")
def _the_option_names_the_back_end(p, c) -> None:
    from grpo_cli.registry import load

    backend = load("grpo_cli.generate.base:GENERATORS").get(c.generator.name)
    p.need(
        backend is None or type(c.generator) is GeneratorConfig or isinstance(c.generator, backend.settings),
        f"generator.name={c.generator.name} does not "
        f"change the back-end's settings; choose the back-end with generator={c.generator.name}",
    )
