"""The catalogue of mistakes: every bad value, broken file, damaged checkpoint and misbehaving reward,
through the real CLI, exits 2 with one sentence and no traceback, and leaves an existing run's every
file byte-identical. The cases that fail at composition run in-process, and fast."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_cli.cli import main
from grpo_cli.models.loading import resolve_path
from helpers import FAST

FAST = [*FAST, "trainer.log_completions_every=0"]
TINY = resolve_path("builtin:tiny")


def copy_model(dst: Path) -> Path:
    import shutil

    shutil.copytree(TINY, dst)
    return dst


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """An existing finished run, and the broken things the cases point at."""
    root = tmp_path_factory.mktemp("bad")
    run = root / "run"
    with pytest.raises(SystemExit):
        main(["train", f"output_dir={run}", *FAST, "trainer.save_every=1"])
        raise SystemExit(0)
    (root / "file").write_text("a regular file")
    truncated = copy_model(root / "truncated")
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate(100_000)
    empty_config = copy_model(root / "empty_config")
    (empty_config / "config.json").write_text("")
    (root / "no_config").mkdir()
    (root / "no_config" / "weights.bin").write_text("")
    damaged_run = root / "damaged_run"
    import shutil

    shutil.copytree(run, damaged_run)
    with open(damaged_run / "checkpoints" / "step-2" / "model.safetensors", "r+b") as f:
        f.truncate(50_000)
    empty_state = root / "empty_state"
    shutil.copytree(run, empty_state)
    (empty_state / "checkpoints" / "step-2" / "trainer_state.pt").write_bytes(b"")
    (empty_state / "checkpoints" / "step-1" / "trainer_state.pt").write_bytes(b"")
    (root / "empty.jsonl").write_text("")
    (root / "raising.py").write_text("def score(completions, **kwargs):\n    raise ValueError('boom')\n")
    (root / "mixed.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n{"prompt": 5, "answer": "x"}\n' * 10)
    (root / "bad.jsonl").write_text('{"prompt": "1+1="\n')
    (root / "noprompt.jsonl").write_text('{"question": "1+1="}\n' * 10)
    (root / "only_header.csv").write_text("prompt,answer\n")
    chats = {
        "norole": [{"content": "1+1="}],
        "badrole": [{"role": "robot", "content": "1+1="}],
        "emptymsg": [{"role": "user", "content": " "}],
        "sysonly": [{"role": "system", "content": "Add."}],
        "ownsys": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}],
        "emptyprompt": "",
    }
    for name, prompt in chats.items():
        (root / f"{name}.jsonl").write_text((json.dumps({"prompt": prompt, "answer": "2"}) + "\n") * 10)
    (root / "bad_tests.jsonl").write_text(
        '{"prompt": "Write f.", "answer": "", "tests": ["assert f(1) == 1"]}\n' * 9
        + '{"prompt": "Write g.", "answer": "", "tests": ["  "]}\n'
    )
    (root / "mixed_tests.jsonl").write_text(
        '{"prompt": "Write f.", "answer": "", "tests": ["assert f(1) == 1"]}\n' * 9
        + '{"prompt": "Write g.", "answer": "", "tests": [5]}\n'
    )
    rewards = root / "rewards"
    rewards.mkdir()
    (rewards / "bad_rewards.py").write_text(
        "import sys\n"
        "def raises(completions, **kw):\n    return [1 / 0 for c in completions]\n"
        "def nan(completions, **kw):\n    return [float('nan')] * len(completions)\n"
        "def exits(completions, **kw):\n    sys.exit(3)\n"
        "def short(completions, **kw):\n    return [1.0]\n"
        "def text(completions, **kw):\n    return ['good'] * len(completions)\n"
        "def none(completions, **kw):\n    return None\n"
        "not_callable = 3\n"
        "def wrong(x):\n    return [1.0]\n"
    )
    sys.path.insert(0, str(rewards))
    (root / "envs.py").write_text(
        "class NoReset:\n    def look(self) -> str:\n        return 'x'\n"
        "def untyped(x):\n    return x\n"
        "class BadReset:\n    def reset(self, **row):\n        raise KeyError('level')\n"
        "    def step(self, text):\n        return 'x', 0.0, True\n"
        "class NumberReset:\n    def reset(self, **row):\n        return 5\n"
        "    def step(self, text):\n        return 'x', 0.0, True\n"
        "class BadStep:\n    def reset(self, **row):\n        return None\n"
        "    def step(self, text):\n        return 'x'\n"
        "class Dup:\n    def reset(self, **row):\n        return None\n"
        '    def add(self, a: int, b: int) -> int:\n        """Add.\n\n        Args:\n'
        '            a: A.\n            b: B.\n        """\n'
        "        return a + b\n"
    )
    return {
        "root": root,
        "run": run,
        "file": root / "file",
        "truncated": truncated,
        "empty_config": empty_config,
        "no_config": root / "no_config",
        "damaged_run": damaged_run,
        "empty_state": empty_state,
        "empty": root / "empty.jsonl",
        "raising": root / "raising.py",
        "mixed": root / "mixed.jsonl",
        "badjson": root / "bad.jsonl",
        "noprompt": root / "noprompt.jsonl",
        "header": root / "only_header.csv",
    }


def fingerprint(run: Path) -> dict:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


# (command line with {placeholders}, a phrase the one sentence must hold)
TRAIN = "train output_dir={run} resume=auto " + " ".join(FAST)
CASES = [
    # values the checks catch at composition, before torch is imported
    (TRAIN + " sampler.temperature=nan", "sampler.temperature=nan must be a finite number"),
    (TRAIN + " sampler.temperature=-1", "sampler.temperature=-1.0 must be >= 0"),
    (TRAIN + " sampler.temperature=0", "sampler.temperature=0.0 must be > 0"),
    (TRAIN + " sampler.top_k=-1", "sampler.top_k=-1 must be >= 0"),
    (TRAIN + " sampler.top_p=1.5", "sampler.top_p=1.5 must be > 0 and <= 1"),
    (TRAIN + " sampler.top_p=0", "sampler.top_p=0.0 must be > 0"),
    (TRAIN + " env.tools=tools.py:add", "env.tools takes a list: env.tools=[tools.py:add] (several: env.tools=[a,b])"),
    (TRAIN + " sampler.group_size=1", "sampler.group_size must be at least 2 (got 1)"),
    (TRAIN + " sampler.max_new_tokens=0", "sampler.max_new_tokens=0 must be >= 1"),
    (TRAIN + " optimizer.lr=-1", "optimizer.lr=-1.0 must be > 0"),
    (TRAIN + " optimizer.lr=nan", "optimizer.lr=nan must be a finite number"),
    (TRAIN + " optimizer.lr=inf", "optimizer.lr=inf must be a finite number"),
    (TRAIN + " optimizer.betas=[0.9]", "optimizer.betas=[0.9] must be two numbers in [0, 1)"),
    (TRAIN + " optimizer.betas=[0.9,1.5]", "optimizer.betas=[0.9, 1.5] must be two numbers in [0, 1)"),
    (TRAIN + " optimizer.weight_decay=-0.1", "optimizer.weight_decay=-0.1 must be >= 0"),
    (TRAIN + " optimizer.eps=0", "optimizer.eps=0.0 must be > 0"),
    (TRAIN + " optimizer.scheduler=reduce_lr_on_plateau", "optimizer.scheduler='reduce_lr_on_plateau' must be one of"),
    (TRAIN + " optimizer.warmup_steps=-1", "optimizer.warmup_steps=-1 must be >= 0"),
    (
        TRAIN + " optimizer.scheduler=polynomial optimizer.lr=1e-8",
        "optimizer.scheduler=polynomial decays the rate to 1e-07, and optimizer.lr=1e-08 is not above it",
    ),
    (TRAIN + " optimizer.max_grad_norm=nan", "optimizer.max_grad_norm=nan must be a finite number"),
    (TRAIN + " optimizer.name=sgd", "optimizer.name='sgd' must be one of adamw"),
    (TRAIN + " algo.eps=-1", "algo.eps=-1.0 must be >= 0"),
    (TRAIN + " algo.beta=nan", "algo.beta=nan must be a finite number"),
    (TRAIN + " algo.beta=-0.1", "algo.beta=-0.1 must be >= 0"),
    (TRAIN + " algo.clip_eps=0", "algo.clip_eps=0.0 must be > 0 and < 1"),
    (TRAIN + " algo.clip_eps=1.5", "algo.clip_eps=1.5 must be > 0 and < 1"),
    (TRAIN + " algo.clip_eps_high=-0.1", "algo.clip_eps_high=-0.1 must be > 0"),
    (TRAIN + " algo.num_iterations=0", "algo.num_iterations=0 must be >= 1"),
    (TRAIN + " algo.aggregation=mean", "algo.aggregation='mean' must be one of seq_mean_token_mean"),
    (TRAIN + " algo.ratio_level=word", "algo.ratio_level='word' must be one of token"),
    (TRAIN + " algo.kl_estimator=k4", "algo.kl_estimator='k4' must be one of k1, k2, k3"),
    (TRAIN + " algo.advantage=gae", "algo.advantage='gae' must be one of grpo, rloo"),
    (TRAIN + " algo.scale=rank", "algo.scale='rank' must be one of group, batch, none"),
    (TRAIN + " algo.std=robust", "algo.std='robust' must be one of population, sample"),
    (TRAIN + " algo.behaviour=random", "algo.behaviour='random' must be one of current, frozen, lagged"),
    (TRAIN + " algo.behaviour=lagged", "algo.behaviour=lagged needs algo.behaviour_refresh >= 1"),
    (TRAIN + " algo.behaviour_path=/x", "algo.behaviour_path is only used with algo.behaviour=frozen"),
    (TRAIN + " algo.ref_refresh=-1", "algo.ref_refresh=-1 must be >= 0"),
    (TRAIN + " algo.max_refill_rounds=-1", "algo.max_refill_rounds=-1 must be >= 0"),
    (TRAIN + " algo.loss=ppo", "algo.loss='ppo' must be one of clip, cispo, sapo"),
    (TRAIN + " algo=cispo algo.loss_args.ratio_max=0", "algo.loss_args.ratio_max=0 must be > 0"),
    (
        TRAIN + " algo=sapo +algo.loss_args.tau=2",
        "algo.loss_args.tau is not a setting of algo.loss=sapo (its settings: tau_pos, tau_neg)",
    ),
    (TRAIN + " algo.clip_ratio_c=0.5", "algo.clip_ratio_c=0.5 must be > 1"),
    (
        TRAIN + " algo=cispo algo.clip_ratio_c=3",
        "algo.clip_ratio_c (dual-clip) bounds the clipped surrogate; it is not used by algo.loss=cispo",
    ),
    (TRAIN + " algo.entropy_coef=-0.1", "algo.entropy_coef=-0.1 must be >= 0"),
    (
        TRAIN + " data=long_addition data.digits=1 data.num_train=60",
        "data.num_train + data.num_test = 80 must be at most 50",
    ),
    (TRAIN + " trainer.seed=-1", "trainer.seed=-1 must be >= 0"),
    (TRAIN + " trainer.save_every=0", "trainer.save_every=0 must be >= 1"),
    (TRAIN + " trainer.log_every=0", "trainer.log_every=0 must be >= 1"),
    (
        TRAIN + " trainer.eval_prompts=0 trainer.eval_every=10",
        "trainer.eval_prompts=0 must be >= 1 (for no held-out evaluation: trainer.eval_before_after=false "
        "trainer.eval_every=0)",
    ),
    (TRAIN + " trainer.steps=-1", "trainer.steps=-1 must be >= 0"),
    (TRAIN + " trainer.prompts_per_step=0", "trainer.prompts_per_step=0 must be >= 1"),
    (TRAIN + " trainer.micro_batch_size=0", "trainer.micro_batch_size=0 must be >= 1"),
    (TRAIN + " trainer.max_tokens_per_micro_batch=-5", "trainer.max_tokens_per_micro_batch=-5 must be >= 0"),
    (TRAIN + " trainer.memory_gib=-1", "trainer.memory_gib=-1.0 must be >= 0"),
    (TRAIN + " trainer.packing=sometimes", "trainer.packing"),
    (TRAIN + " trainer.memory_gib=0.05", "trainer.memory_gib=0.05 cannot hold generation"),
    (
        "train output_dir={root}/fresh_plan " + " ".join(FAST) + " trainer.memory_gib=4 sampler.max_new_tokens=100000 "
        "trainer.prompts_per_step=1 sampler.group_size=2",
        "trainer.memory_gib=4 leaves room for",
    ),
    (
        TRAIN + " trainer.memory_gib=4 trainer.max_tokens_per_micro_batch=100000000",
        "trainer.max_tokens_per_micro_batch=100000000 does not fit in trainer.memory_gib=4",
    ),
    (TRAIN + " trainer.keep_last=-1", "trainer.keep_last=-1 must be >= 0"),
    (TRAIN + " trainer.eval_every=-1", "trainer.eval_every=-1 must be >= 0"),
    (TRAIN + " trainer.threads=-1", "trainer.threads=-1 must be >= 0"),
    (TRAIN + " trainer.nonfinite_patience=0", "trainer.nonfinite_patience=0 must be >= 1"),
    (TRAIN + " trainer.precision=fp16", "trainer.precision='fp16' must be one of auto, fp32, bf16-mixed, bf16"),
    (TRAIN + " trainer.strategy=tp", "trainer.strategy='tp' must be one of auto, single, ddp, fsdp"),
    (TRAIN + " model.device=gpu", "model.device='gpu' must be auto, cpu, cuda or cuda:N"),
    (TRAIN + " model.lora.r=-1", "model.lora.r=-1 must be >= 0"),
    (TRAIN + " model.lora.r=8 model.lora.alpha=0", "model.lora.alpha=0.0 must be > 0"),
    (TRAIN + " model.lora.quantize=8bit model.lora.r=8", "model.lora.quantize='8bit' must be one of 4bit"),
    (TRAIN + " model.lora.quantize=4bit", "model.lora.quantize=4bit quantizes the frozen base of a LoRA run"),
    (
        TRAIN + " model.recompute_pointwise=sometimes",
        "model.recompute_pointwise='sometimes' must be one of auto, true, false",
    ),
    (TRAIN + " model.lora.r=8 algo.ref_refresh=5", "algo.ref_refresh copies the policy into a second model"),
    (TRAIN + " reward=combo reward.terms=[]", "reward=combo needs reward.terms"),
    (TRAIN + " reward=combo reward.terms=[exact_match,nope]", "reward.terms='nope' must be one of"),
    (TRAIN + " reward=combo reward.terms=[format,format]", "names a reward twice"),
    (TRAIN + " reward.extract=regex", "reward.extract=regex needs reward.pattern"),
    (TRAIN + " reward.extract=regex reward.pattern='(unclosed'", "reward.pattern '(unclosed' does not compile"),
    (TRAIN + " reward.extract=first", "reward.extract='first' must be one of last_number"),
    (TRAIN + " reward=python", "reward=python needs reward.fn"),
    (TRAIN + " reward=model", "reward=model needs reward.model_path"),
    (
        TRAIN + " reward.weights=[1.0]",
        "reward.weights is only read by reward=combo or a list of functions in reward.fn",
    ),
    (TRAIN + " reward=length reward.overlong_buffer=600", "reward.overlong_buffer=600 must be >= 0 and below"),
    (TRAIN + " reward.correct_threshold=nan", "reward.correct_threshold=nan must be a finite number"),
    (
        "train output_dir={root}/fresh_tests "
        + " ".join(FAST)
        + " reward=code data=files data.train_file={root}/bad_tests.jsonl "
        "data.test_size=2 trainer.prompts_per_step=2",
        "split) holds '  ', not a test; give a list of",
    ),
    (
        "train output_dir={root}/fresh_tests2 " + " ".join(FAST) + " reward=code data=files "
        "data.train_file={root}/mixed_tests.jsonl data.test_size=2 trainer.prompts_per_step=2",
        "split) holds 5, not a test; give a list of",
    ),  # the odd row named
    (TRAIN + " trainer.health=loud", "trainer.health='loud' must be one of warn, stop, off"),
    (TRAIN + " data=code data.num_test=62", "data.num_test=62 must be between 1 and 61"),
    (TRAIN + " reward.workers=-1", "reward.workers=-1 must be >= 0"),
    (TRAIN + " reward.timeout_s=0", "reward.timeout_s=0.0 must be > 0"),
    (TRAIN + " reward.max_failed_fraction=1.5", "reward.max_failed_fraction=1.5 must be >= 0 and <= 1"),
    (TRAIN + " reward.worker_memory_gib=-1", "reward.worker_memory_gib=-1.0 must be >= 0"),
    (TRAIN + " reward=code reward.code_cpu_s=0", "reward.code_cpu_s=0.0 must be > 0"),
    (TRAIN + " reward=code reward.code_memory_mib=8", "reward.code_memory_mib=8 must be >= 32"),
    (TRAIN + " reward=code reward.code_output_kib=0", "reward.code_output_kib=0 must be >= 1"),
    (TRAIN + " reward=code reward.tests_field=''", "reward=code needs reward.tests_field"),
    (TRAIN + " reward=code reward.sandbox=none", "reward.sandbox='none' must be one of os, process"),
    (
        "train output_dir={root}/fresh_code " + " ".join(FAST) + " reward=code",
        "reward=code reads each row's tests from the dataset column 'tests', which this data does not have",
    ),
    (TRAIN + " data.name=nope", "data.name='nope' must be one of arithmetic"),
    (TRAIN + " data.test_size=0", "data.test_size=0.0 must be > 0"),
    (TRAIN + " data.max_prompt_length=0", "data.max_prompt_length=0 must be >= 1"),
    (TRAIN + " data.answer_extract=first", "data.answer_extract='first' must be one of hash, boxed, last_number"),
    (TRAIN + " data.template='{{}}x'", "has an empty {{}}"),
    (TRAIN + " data.system_prompt=hello", "data.system_prompt is only used with data.chat_template=true"),
    (TRAIN + " data=files", "data=files needs data.train_file"),
    (TRAIN + " data=hub", "data=hub needs data.hub_name"),
    (TRAIN + " data.max_operand=0", "data.max_operand=0 must be >= 1"),
    (TRAIN + " data.num_test=0", "data.num_test=0 must be between 1 and 99"),
    # composition errors: unknown keys, types, options, syntax, required values
    (TRAIN + " +trainer.foo=1", "trainer.foo is not a setting; the keys under trainer are steps, prompts_per_step"),
    # TRL's names point to ours; a top-level key lists the real top-level keys
    (TRAIN + " algo.epsilon=0.3", "epsilon is TRL's name: here it is algo.clip_eps"),
    (TRAIN + " sampler.num_generations=4", "num_generations is TRL's name: here it is sampler.group_size"),
    (TRAIN + " optimizer.learning_rate=1e-5", "learning_rate is TRL's name: here it is optimizer.lr"),
    (TRAIN + " trainer.bf16=true", "bf16 is TRL's name: here it is trainer.precision"),
    (TRAIN + " +trainer.gradient_accumulation_steps=4", "here it is trainer.micro_batch_size"),
    (TRAIN + " beta=0.0", "beta is TRL's name: here it is algo.beta"),
    ("evaluate eval_prompts=3", "the keys at the top are model, reward"),
    (
        "evaluate checkpoint={run} reward=python reward.fn={raising}:score",
        "Reward 'python' raised ValueError: boom on completion 0",
    ),
    (TRAIN + " optimizer.lr=1e-4,3e-4", "a comma-separated list is a sweep: add -m to run one job per value"),
    (TRAIN + " --steps 10", "--steps is not an option: grpo takes key=value overrides; here it is trainer.steps=10"),
    (TRAIN + " +trainer.stepss=1", "trainer.stepss is not a setting; did you mean trainer.steps?"),
    (TRAIN + " trainer.stepz=3", "trainer.stepz is not a setting; did you mean trainer.steps?"),
    (TRAIN + " trainer.steps=many", "trainer.steps=many is not an integer"),
    (TRAIN + " algo.beta=lots", "algo.beta=lots is not a float"),
    (TRAIN + " model=qwn", "model takes instruct, qwen, tiny"),
    (TRAIN + " experiment=nope", "experiment takes chain_agent, instruct, qwen_gsm8k, smollm2_arithmetic"),
    (TRAIN + " trainer.steps=[1", "write overrides as key=value"),
    (TRAIN + " model=instruct", "model.path is empty; give the model with model.path=HUB_ID_OR_DIRECTORY"),
    # files, models, checkpoints, run directories: found when loaded, before any step
    (
        "train output_dir={root}/fresh0 " + " ".join(FAST) + " model.path=/nonexistent/model",
        "model.path=/nonexistent/model does not exist",
    ),
    (
        "train output_dir={root}/fresh00 " + " ".join(FAST) + " model.path={no_config}",
        "has no config.json, so it is not a Hugging Face model directory",
    ),
    (
        "train output_dir={root}/fresh1 " + " ".join(FAST) + " model.path={truncated}",
        "its files are damaged or incomplete",
    ),
    (
        "train output_dir={root}/fresh2 " + " ".join(FAST) + " model.path={empty_config}",
        "its files are damaged or incomplete",
    ),
    (
        "train output_dir={root}/fresh3 "
        + " ".join(FAST)
        + " algo.behaviour=frozen algo.behaviour_path=/nonexistent/x",
        "algo.behaviour_path=/nonexistent/x does not exist",
    ),
    (
        "train output_dir={root}/fresh4 " + " ".join(FAST) + " data=files data.train_file=/nonexistent.jsonl",
        "data.train_file=/nonexistent.jsonl does not exist",
    ),
    ("train output_dir={root}/fresh5 " + " ".join(FAST) + " data=files data.train_file={empty}", "has no rows"),
    ("train output_dir={root}/fresh6 " + " ".join(FAST) + " data=files data.train_file={header}", "has no rows"),
    (
        "train output_dir={root}/fresh7 " + " ".join(FAST) + " data=files data.train_file={badjson}",
        "Could not read data.train_file",
    ),
    (
        "train output_dir={root}/fresh8 " + " ".join(FAST) + " data=files data.train_file={noprompt}",
        "Column 'prompt' is missing",
    ),
    ("train output_dir={root}/fresh9 " + " ".join(FAST) + " data=files data.train_file={mixed}", "mixes value types"),
    (
        "train output_dir={root}/fresh10 " + " ".join(FAST) + " data=files data.train_file=x.txt",
        "is not a .jsonl, .json, .csv or .parquet",
    ),
    (
        "train output_dir={root}/fresh11 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:raises",
        "Reward 'python' raised ZeroDivisionError",
    ),
    (
        "train output_dir={root}/fresh12 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:nan",
        "rewards must be finite floats",
    ),
    (
        "train output_dir={root}/fresh13 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:exits",
        "called sys.exit(3)",
    ),
    (
        "train output_dir={root}/fresh14 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:short",
        "returned 1 values for",
    ),
    (
        "train output_dir={root}/fresh15 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:text",
        "rewards must be finite floats",
    ),
    ("train output_dir={root}/fresh16 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:none", "not a list"),
    (
        "train output_dir={root}/fresh17 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:not_callable",
        "has no function",
    ),
    (
        "train output_dir={root}/fresh18 " + " ".join(FAST) + " reward=python reward.fn=no_such_module_xyz:score",
        "cannot be imported",
    ),
    (
        "train output_dir={root}/fresh19 " + " ".join(FAST) + " reward=python reward.fn=bad_rewards:wrong",
        "wrong() requires x, which no call passes",
    ),
    (
        "train output_dir={root}/fresh19 " + " ".join(FAST) + " reward=model reward.model_path=/nonexistent/rm",
        "does not exist",
    ),
    (
        "train output_dir={root}/fresh20 " + " ".join(FAST) + " reward=format reward.format_pattern='(x'",
        "does not compile",
    ),
    ("train output_dir={run} " + " ".join(FAST), "already holds a run"),
    (TRAIN + " trainer.steps=1", "is at step 2, past trainer.steps=1"),
    (TRAIN + " optimizer.lr=1e-3", "Refusing to resume"),
    ("train resume={damaged_run}/checkpoints/step-2 " + " ".join(FAST), "Cannot resume from"),
    ("train resume={empty_state}/checkpoints/step-2 " + " ".join(FAST), "cannot be read as a trainer state"),
    (
        "train resume=/nonexistent/checkpoint " + " ".join(FAST),
        "resume=/nonexistent/checkpoint is neither a checkpoint",
    ),
    ("train output_dir={file}/run " + " ".join(FAST), "Cannot write to the run directory"),
    ("train hydra.run.dir={file}/run " + " ".join(FAST), "Cannot write to the run directory"),
    # grpo evaluate: every input checked before the first model is evaluated
    ("evaluate checkpoint=/missing output_dir={root}/e1", "checkpoint=/missing does not exist"),
    ("evaluate checkpoint=[{run},/missing] output_dir={root}/e2", "checkpoint=/missing does not exist"),
    ("evaluate checkpoint={truncated} output_dir={root}/e3", "checkpoint={truncated} cannot be loaded"),
    ("evaluate checkpoint={no_config} output_dir={root}/e4", "is neither a model directory"),
    ("evaluate checkpoint={run} output_dir={file}/x", "Cannot write to the run directory"),
    ("evaluate samples=-1", "samples=-1 must be >= 0"),
    ("evaluate k=[1,16] samples=8", "k=[1, 16] asks for pass@k and maj@k from samples=8"),
    ("evaluate limit=0", "limit=0 must be >= 1"),
    ("evaluate precision=fp8", "precision='fp8' must be one of fp32, bf16, fp16"),
    ("evaluate batch_size=0", "batch_size=0 must be >= 1"),
    ("evaluate sampler.temperature=0 samples=4", "sampler.temperature=0.0 must be > 0"),
    ("evaluate +foo=1", "foo is not a setting"),
    ("evaluate checkpoint=[] output_dir={root}/e5", "checkpoint=[] names no model"),
    (
        "evaluate split=validation data.max_operand=9 data.num_test=20 output_dir={root}/e6",
        "split='validation' is not in data",
    ),
    # environments and tools (env.*)
    (TRAIN + " env.max_turns=0", "env.max_turns=0 must be >= 1"),
    (TRAIN + " env.max_tokens=0", "env.max_tokens=0 must be >= 1"),
    (TRAIN + " env.timeout_s=-1", "env.timeout_s=-1.0 must be > 0"),
    (TRAIN + " env.tool_format=json", "env.tool_format='json' must be one of auto, schema, qwen3_coder, glm, hermes"),
    (TRAIN + " env.tools=[grpo_cli.demo.tools:add]", "env.tools needs the chat template"),
    (
        TRAIN + " env.tools=[/missing.py:f] data.chat_template=true",
        "env.tools=/missing.py:f: there is no file /missing.py",
    ),
    (
        TRAIN + " env.tools=[no_such_module_xyz:f] data.chat_template=true",
        "env.tools='no_such_module_xyz:f' cannot be imported",
    ),
    (TRAIN + " env.fn_dir={root} env.factory=envs.py:NoReset", "NoReset has no reset method"),
    (
        TRAIN + " env.fn_dir={root} env.tools=[envs.py:untyped] model.path=builtin:tiny-tools data.chat_template=true",
        "'untyped' cannot be shown to the model as a tool",
    ),
    (
        "train output_dir={root}/r1 env.fn_dir={root} env.factory=envs.py:BadReset " + " ".join(FAST),
        "reset() failed ('level')",
    ),
    (
        "train output_dir={root}/r2 env.fn_dir={root} env.factory=envs.py:NumberReset " + " ".join(FAST),
        "reset() returned int",
    ),
    (
        "train output_dir={root}/r3 env.fn_dir={root} env.factory=envs.py:BadStep " + " ".join(FAST),
        "step() returned 'x'; it must return (observation, reward, done)",
    ),
    ("evaluate env.max_turns=0", "env.max_turns=0 must be >= 1"),
    (TRAIN + " trainer.max_staleness=-1", "trainer.max_staleness=-1 must be >= 0"),
    (TRAIN + " generator.threads=-2", "generator.threads=-2 must be >= 0"),
    (TRAIN + " generator.timeout_s=0", "generator.timeout_s=0.0 must be > 0"),
    (
        TRAIN + " trainer.max_staleness=1 algo.behaviour=frozen",
        "and algo.behaviour=frozen already samples from a policy of its own; set trainer.max_staleness=0",
    ),
    (TRAIN + " trainer.max_staleness=1 generator.device=cuda:7", "generator.device"),
    # values with no effect, or one no run could live with
    (TRAIN + " env.timeout_s=1e30", "env.timeout_s=1e+30 must be > 0 and <= 86400"),
    (TRAIN + " reward.timeout_s=1e30", "reward.timeout_s=1e+30 must be > 0 and <= 86400"),
    (TRAIN + " generator.timeout_s=1e30", "generator.timeout_s=1e+30 must be > 0 and <= 86400"),
    (TRAIN + " generator.device=cpu", "generator.device=cpu places the generation worker, but there is none"),
    (TRAIN + " generator.weights=int4", "generator.weights='int4' must be one of full, bf16"),
    (TRAIN + " generator.matmul=mkl", "generator.matmul='mkl' must be one of auto, packed, plain"),
    (
        TRAIN + " generator.weights=bf16 trainer.precision=bf16-mixed",
        "generator.weights=bf16 samples in bf16, which trainer.precision=bf16-mixed already does; drop one",
    ),
    (
        TRAIN + " generator=vllm generator.weights=bf16",
        "generator.weights is not a setting of this generator: it is generator=hf's; drop it or choose that one.",
    ),
    (
        "train output_dir={root}/budget " + " ".join(FAST) + " trainer.max_tokens_per_micro_batch=5",
        "trainer.max_tokens_per_micro_batch=5 is smaller than the longest row a step can hold",
    ),
    (
        TRAIN + " reward=combo reward.terms=[exact_match,format] reward.weights=[0,0]",
        "reward.weights=[0.0, 0.0] are all zero, so every completion would score 0",
    ),
    (
        "train output_dir={root}/dup " + " ".join(FAST) + " data.chat_template=true model.path=builtin:tiny-tools "
        "env.fn_dir={root} env.factory=envs.py:Dup env.tools=[grpo_cli.demo.tools:add]",
        "Two tools are named 'add'",
    ),
    # prompts a model cannot be asked
    *[
        (
            "train output_dir={root}/chat_" + name + " " + " ".join(FAST) + " model.path=builtin:tiny-tools data=files "
            "data.chat_template=true data.train_file={root}/" + name + ".jsonl" + extra,
            phrase,
        )
        for name, extra, phrase in [
            ("norole", "", "Row 0's prompt has a message whose role is None; each message needs a role"),
            ("badrole", "", "Row 0's prompt has a message whose role is 'robot'"),
            ("emptymsg", "", "Row 0's prompt has a user message with no content"),
            ("sysonly", "", "Row 0's prompt has only system messages; add the user's message"),
            (
                "ownsys",
                " data.system_prompt=hi",
                "data.system_prompt is set, but row 0's prompt brings its own system message",
            ),
            ("emptyprompt", "", "Row 0's prompt is empty; give every row a prompt"),
        ]
    ],
    (
        "sample prompt=x env.tool_format=json",
        "env.tool_format='json' must be one of auto, schema, qwen3_coder, glm, hermes",
    ),
    # grpo sample
    ("sample", "no prompt given"),
    ("sample prompts_file=/missing.txt", "prompts_file=/missing.txt does not exist"),
    ("sample prompts_file={badjson}", "is not JSON"),
    ("sample checkpoint=/missing prompt=x", "checkpoint=/missing does not exist"),
    ("sample checkpoint={truncated} prompt=x", "cannot be loaded"),
    ("sample prompt=x output={file}/out.jsonl", "Cannot write to"),
    ("sample prompt=x sampler.group_size=0", "sampler.group_size=0 must be >= 1"),
    ("sample prompt=x precision=fp8", "precision='fp8' must be one of"),
    ("sample prompt=x threads=-1", "threads=-1 must be >= 0"),
]


@pytest.mark.parametrize("command, phrase", CASES, ids=[f"{i:03d}" for i in range(len(CASES))])
def test_a_mistake_is_one_sentence_exit_2_and_the_existing_run_is_untouched(w, command, phrase, capsys):
    before = fingerprint(w["run"])
    args = command.format(**{k: str(v) for k, v in w.items()}).split()
    with pytest.raises(SystemExit) as e:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    text = out.out + out.err
    assert e.value.code == 2, text[-2000:]
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), text[-2000:]  # one line, never wrapped
    assert phrase.format(**{k: str(v) for k, v in w.items()}) in errors[0], errors[0]
    assert fingerprint(w["run"]) == before


def test_the_catalogue_covers_at_least_80_mistakes_across_the_three_commands():
    commands = {c.split()[0] for c, _ in CASES}
    assert len(CASES) >= 80 and commands == {"train", "evaluate", "sample"}


def _a_config_mistake(arg: str = "sampler.temperature=-1") -> tuple[str, str, float]:
    """(exit code, whether torch was imported, seconds) of `grpo train ARG` in a fresh process."""
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from grpo_cli.cli import main\n"
        f"try:\n    main(['train', *{arg.split()!r}])\n"
        "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, round(time.perf_counter() - t, 2))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    code_, torch_loaded, seconds = out.stdout.split()
    return code_, torch_loaded, float(seconds)


@pytest.mark.parametrize(
    "arg",
    [
        "sampler.temperature=-1",
        "algo.loss=nope",
        "generator.name=nope",
        "trainer.trackers=[nope]",
        "model.path=/nonexistent/model",
        "resume=/nonexistent/run",
        "data=files data.train_file=/nonexistent/train.jsonl",
        "model.path=builtin:nope",
        "reward=model reward.model_path=/nonexistent/rm",
        "reward=python reward.fn=nomod_4731:score",
        "env.factory=nomod_4731:Env data.chat_template=true",
    ],
)
def test_a_config_mistake_fails_before_torch_loads(arg):
    """Composition and value checks, the registries' names included, and paths that are not there, run before
    torch is imported."""
    code_, torch_loaded, _ = _a_config_mistake(arg)
    assert code_ == "2" and torch_loaded == "False"


@pytest.mark.timing
def test_a_config_mistake_fails_in_well_under_two_seconds():
    assert _a_config_mistake()[2] < 1.5


def test_a_pickled_object_in_a_trainer_state_is_refused_and_never_runs(w, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(w["run"], run)
    marker = tmp_path / "side_effect_happened"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    torch.save({"step": 2, "payload": Evil()}, run / "checkpoints" / "step-2" / "trainer_state.pt")
    with pytest.raises(SystemExit) as e:
        main(["train", f"resume={run}/checkpoints/step-2", *FAST])
    assert e.value.code == 2
    assert "cannot be read as a trainer state" in capsys.readouterr().err
    assert not marker.exists()


def _truncate(f: Path, size: int) -> None:
    with open(f, "r+b") as handle:
        handle.truncate(size)


DAMAGES = {  # what a kill or a full disk leaves in a checkpoint
    "truncated weights": lambda step: _truncate(step / "model.safetensors", 50_000),
    "truncated state": lambda step: _truncate(step / "trainer_state.pt", 1_000),
    "empty state": lambda step: (step / "trainer_state.pt").write_bytes(b""),
    "corrupt config": lambda step: (step / "config.json").write_text('{"model_type": "llama", '),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_auto_sets_a_damaged_newest_checkpoint_aside_and_redoes_its_steps(w, tmp_path, capsys, damage):
    """resume=auto passes over a step-2 that cannot be read, resumes from step-1 saying in one line which steps
    are redone, and keeps the damaged checkpoint, moved to step-2.damaged/, byte for byte: the run's own
    step-2 save cannot replace it."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(w["run"], run)
    DAMAGES[damage](run / "checkpoints" / "step-2")
    before = fingerprint(run / "checkpoints" / "step-2")
    with pytest.raises(SystemExit) as e:
        args = [a for a in FAST if "steps" not in a]
        main(["train", f"output_dir={run}", "resume=auto", *args, "trainer.steps=3", "trainer.save_every=1"])
        raise SystemExit(0)
    text = capsys.readouterr().err
    assert e.value.code in (0, None), text
    line = next(x for x in text.splitlines() if "cannot be read" in x)
    assert "step-2 cannot be read" in line and "resuming from step-1 and redoes step 2" in line, text
    assert "moved to checkpoints/step-2.damaged/" in line, text
    assert fingerprint(run / "checkpoints" / "step-2.damaged") == before  # kept as it was
    rows = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3]  # step 2 was redone from step 1
    assert (run / "checkpoints" / "step-2" / "trainer_state.pt").exists()  # the redone step's own, beside it


def test_a_refused_resume_moves_nothing(w, tmp_path, capsys):
    """The damaged checkpoint is moved only once the run is accepted: a resume refused for changed settings
    leaves the run directory as it was."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(w["run"], run)
    DAMAGES["empty state"](run / "checkpoints" / "step-2")
    before = fingerprint(run)
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={run}", "resume=auto", *FAST, "optimizer.lr=1e-3"])
    assert e.value.code == 2 and "Refusing to resume" in capsys.readouterr().err
    assert fingerprint(run) == before


def test_a_checkpoint_whose_state_does_not_load_is_one_sentence_and_the_logs_stay_whole(w, tmp_path, capsys):
    """Resuming from step 1 of a 2-step run whose step-1 optimizer state is damaged: one sentence naming the
    part, exit 2, and metrics.jsonl and completions.jsonl untouched (they are cut back to the checkpoint's step
    only once every part of it has loaded)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(w["run"], run)
    path = run / "checkpoints" / "step-1" / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    state["optimizer"] = {"state": {}, "param_groups": []}
    torch.save(state, path)
    logs = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "completions.jsonl") if (run / name).exists()}
    assert logs["metrics.jsonl"].count(b"\n") >= 2
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={run}", f"resume={run}/checkpoints/step-1", *FAST])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "step-1's optimizer state does not load" in err and "resume=PATH" in err, err
    assert {name: (run / name).read_bytes() for name in logs} == logs


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_disk_during_a_save_is_one_sentence_and_keeps_the_previous_checkpoint(tmp_path, capsys):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "15m"):  # one 10 MB checkpoint of the tiny model fits, two do not
        pytest.skip("a full disk needs a small tmpfs, which needs root and mount here (not available)")
    try:
        with pytest.raises(SystemExit) as e:
            main(
                [
                    "train",
                    f"output_dir={disk}/run",
                    *[a for a in FAST if "steps" not in a],
                    "trainer.steps=3",
                    "trainer.save_every=1",
                ]
            )
            raise SystemExit(0)
        text = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in text, text[-2000:]
        assert "the disk is full" in text
        saved = sorted(p.name for p in (disk / "run" / "checkpoints").iterdir())
        assert "step-1" in saved and not any(name.startswith(".tmp") for name in saved)
        from grpo_cli.run.checkpoint import load_state

        assert load_state(disk / "run" / "checkpoints" / "step-1")["step"] == 1
    finally:
        subprocess.run(
            ["umount", "-l", str(disk)], capture_output=True
        )  # lazy: a file still open cannot keep it mounted


def test_sigkill_while_final_is_written_leaves_no_broken_final_and_resume_completes_it(tmp_path):
    """The child slows the flush of the staged final/ so the kill lands inside it."""
    code = (
        "import sys, time\n"
        "from grpo_cli.run import checkpoint\n"
        "real = checkpoint._fsync_tree\n"
        "def slow(path):\n    real(path)\n    time.sleep(30) if path.name == '.tmp-final' else None\n"
        "checkpoint._fsync_tree = slow\n"
        "from grpo_cli.cli import main\n"
        f"main(['train', 'output_dir={tmp_path}', *{FAST!r}])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / ".tmp-final" / "model.safetensors").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert not (tmp_path / "final").exists()  # staged, never half-written in place
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}", "resume=auto", *FAST])
        raise SystemExit(0)
    assert e.value.code in (0, None)
    assert not (tmp_path / ".tmp-final").exists()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "final")


def test_a_reward_signature_is_read_before_the_model_loads():
    """What a python reward requires must be something a call passes: a keyword of the calling convention
    or a dataset column; TRL's signatures and **kwargs pass; a parameter taken only by position does not."""
    from grpo_cli.errors import GrpoError
    from grpo_cli.rewards.python_fn import check_signature

    def trl_style(prompts, completions, completion_ids, **kwargs): ...
    def by_column(completions, a, b=None): ...
    def needs(completions, solution): ...
    def positional(completions, /): ...

    columns = ["prompt", "answer", "a"]
    check_signature(trl_style, "m:trl_style", columns)
    check_signature(by_column, "m:by_column", columns)
    with pytest.raises(GrpoError, match=r"needs\(\) requires solution, which no call passes.*\(prompt, answer, a\)"):
        check_signature(needs, "m:needs", columns)
    with pytest.raises(GrpoError, match=r"positional\(\) requires completions"):
        check_signature(positional, "m:positional", columns)
    check_signature(needs, "m:needs", [*columns, "solution"])


def test_a_worker_deadline_shorter_than_a_step_is_one_sentence(tmp_path, capsys):
    """generator.timeout_s=0.01 with a generation worker: the worker cannot sample a step that fast, and its
    weight transport joins on the start's deadline, not this one (once a traceback from gloo's connect)."""
    with pytest.raises(SystemExit) as e:
        main(["train", f"output_dir={tmp_path}/run", *FAST, "generator.worker=true", "generator.timeout_s=0.01"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the generation worker did not answer within 0.01 s" in errors[0], err[-2000:]
