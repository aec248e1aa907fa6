"""The environment's wall time per step: its calls one at a time (env.concurrency=1) against concurrent.

    python scripts/bench_episodes.py                                   # 64 episodes x 3 tool turns, 100 ms calls
    python scripts/bench_episodes.py --episodes 16 --delay 0.05 --concurrency 1,4,16

Each episode resets a slow environment (tests/inputs/sleepy_env.py: every reset and tool call sleeps --delay
seconds, plus up to --jitter more at random, and draws from Python's and NumPy's global generators and its
own), then calls its tool in --turns turns and answers in one more. A replaying generator writes the turns
(the same text for every episode), so what is timed is the environment and the episode driver around it, not a
model; the tokenizer and chat template are the built-in tool model's. Prints the seconds per step of each
concurrency, the ratio to the first, and whether every transcript (messages and token ids) equals the first's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

INPUTS = Path(__file__).resolve().parents[1] / "tests" / "inputs"


def replaying(turns: int):
    """A generator class whose turn k (counted by the tool results in the context) calls look(k) while
    k < turns, then answers "done"."""
    from grpo_cli.generate.hf import HFGenerator

    class Replaying(HFGenerator):
        def complete(self, model, contexts, sampling, seeds=None, *, with_logprobs=False):
            out, eos = [], self.tokenizer.eos_token_id
            for ctx in contexts:
                turn = self.tokenizer.decode(ctx).count("</tool_response>")
                text = (
                    "<tool_call>\n" + json.dumps({"name": "look", "arguments": {"k": turn}}) + "\n</tool_call>"
                    if turn < turns
                    else "done"
                )
                ids = self.tokenizer.encode(text, add_special_tokens=False) + [eos]
                out.append((ids, [0.0] * len(ids) if with_logprobs else None, True))
            return out

    return Replaying


def measure(
    episodes: int, turns: int, delay: float, jitter: float, concurrency: int, workers: int = 0, sandbox: str = "none"
) -> tuple[float, list]:
    """(seconds of one step's episodes, their transcripts as (messages, ids)) at this concurrency, the
    environments in this process (workers=0) or in that many environment workers (confined with
    sandbox="os")."""
    import os

    if str(INPUTS) not in sys.path:
        sys.path.insert(0, str(INPUTS))
    import sleepy_env  # the module env.factory names below, so DELAY and JITTER are set where they are read

    from grpo_cli.config import EnvConfig, SamplerConfig, TrainConfig
    from grpo_cli.episodes.driver import with_env
    from grpo_cli.episodes.environments import environment
    from grpo_cli.generate.base import GENERATORS, make_generator, register_generator
    from grpo_cli.models.loading import load_model, load_tokenizer

    sleepy_env.DELAY, sleepy_env.JITTER = delay, jitter
    os.environ["SLEEPY_DELAY"], os.environ["SLEEPY_JITTER"] = str(delay), str(jitter)  # for environment workers
    register_generator("replaying", replaying(turns))
    try:
        tokenizer, model = load_tokenizer("builtin:tiny-tools"), load_model("builtin:tiny-tools", device="cpu")
        settings = TrainConfig().generator
        settings.name = "replaying"
        env = EnvConfig(
            factory="sleepy_env:Sleepy",
            fn_dir=str(INPUTS),
            max_turns=turns + 1,
            max_tokens=2048,
            concurrency=concurrency,
            workers=workers,
            sandbox=sandbox,
        )
        spec = environment(env)
        gen = with_env(
            make_generator(settings, tokenizer, chat_template=True, precision=None, device="cpu"),
            spec,
            tokenizer,
            chat_template=True,
        )
        groups = max(1, episodes // 4)
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"{i}+{i}="}],
                tools=spec.schemas,
                tokenize=False,
                add_generation_prompt=True,
            )
            for i in range(groups)
        ]
        start = time.perf_counter()
        roll = gen.generate(
            model,
            prompts,
            episodes // groups,
            SamplerConfig(96),
            seeds=list(range(groups)),
            columns={"answer": ["0"] * groups},
        )
        seconds = time.perf_counter() - start
        gen.close()
        return seconds, [(ep.messages, ep.ids) for ep in roll.episodes]
    finally:  # registered for this measurement only: the registry and the `generator` option it made go
        from hydra.core.config_store import ConfigStore

        GENERATORS.pop("replaying", None)
        ConfigStore.instance().repo["generator"].pop("replaying.yaml", None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3, help="tool-calling turns per episode (one more answers)")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds each reset and tool call sleeps")
    parser.add_argument("--jitter", type=float, default=0.0, help="up to this many seconds more per call, at random")
    parser.add_argument(
        "--concurrency", default="1,64", help="comma-separated env.concurrency values; the first is the baseline"
    )
    parser.add_argument("--workers", type=int, default=0, help="env.workers: environment processes (0 = this one)")
    parser.add_argument(
        "--sandbox",
        default="none",
        choices=("none", "os"),
        help="env.sandbox of the workers (os: confined by the kernel; with --workers)",
    )
    args = parser.parse_args(argv)
    import torch

    from grpo_cli.models.runtime import prepare_libraries

    prepare_libraries()
    torch.set_num_threads(1)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(
        f"{args.episodes} episodes x {args.turns} tool turns (+1 answer), reset and each call {args.delay:g} s "
        f"(+ up to {args.jitter:g} s); CPU: {torch.backends.cpu.get_cpu_capability()}"
    )
    base_s, base_t = measure(args.episodes, args.turns, args.delay, args.jitter, levels[0])
    print(f"env.concurrency={levels[0]:<4} {base_s:7.2f} s/step  1.00x")
    for level in levels[1:]:
        seconds, transcripts = measure(
            args.episodes, args.turns, args.delay, args.jitter, level, args.workers, args.sandbox
        )
        print(
            f"env.concurrency={level:<4} workers={args.workers} sandbox={args.sandbox} {seconds:7.2f} s/step  "
            f"{seconds / base_s:.3f}x  "
            f"transcripts {'equal' if transcripts == base_t else 'DIFFER'}"
        )


if __name__ == "__main__":
    main()
