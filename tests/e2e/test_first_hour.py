"""What a TRL GRPOTrainer user brings in their first hour, through the real CLI: conversational data and
TRL's own reward functions, several python rewards with weights, a reward named by its file (found again
by evaluate from another directory)."""

import json
import shutil
from pathlib import Path

import pytest

from helpers import grpo, grpo_process, read_jsonl

INPUTS = Path(__file__).parents[1] / "inputs"
ONE_STEP = [
    "trainer.steps=1",
    "trainer.prompts_per_step=4",
    "sampler.group_size=2",
    "trainer.progress=false",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
    "trainer.log_completions_every=1",
]


def conversational_jsonl(path: Path, rows: int = 8) -> Path:
    """TRL's conversational format: `prompt` a list of messages (a system message on every other row), and
    the answer in a `solution` column, as in TRL's math examples."""
    with open(path, "w") as f:
        for i in range(rows):
            a, b = i % 5, (3 * i) % 5
            system = [{"role": "system", "content": "1"}] if i % 2 else []
            f.write(
                json.dumps({"prompt": system + [{"role": "user", "content": f"{a}+{b}"}], "solution": str(a + b)})
                + "\n"
            )
    return path


def test_conversational_prompts_are_rendered_by_the_chat_template_system_message_included(chat_dir, tmp_path):
    from grpo_cli.config import DataConfig
    from grpo_cli.data.tasks import load_data
    from grpo_cli.models.loading import load_tokenizer

    file = conversational_jsonl(tmp_path / "chat.jsonl")
    cfg = DataConfig(name="files", train_file=str(file), test_size=0.25, answer_field="solution", chat_template=True)
    tok = load_tokenizer(str(chat_dir))
    data = load_data(cfg, tok)
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    by_user = {r["prompt"][-1]["content"] + ("s" if len(r["prompt"]) > 1 else ""): r for r in rows}
    for split in ("train", "test"):
        for rendered, messages in zip(data[split]["prompt"], data[split]["_prompt_messages"]):
            key = messages[-1]["content"] + ("s" if len(messages) > 1 else "")
            # the message list as written, and its rendering worked by hand from conftest's CHAT_TEMPLATE
            assert [{k: v for k, v in m.items() if v is not None} for m in messages] == by_user[key]["prompt"]
            assert rendered == ("1+" if len(messages) > 1 else "") + messages[-1]["content"] + "="
    # Without the chat template the messages would be str()-ed into the prompt: refused, with the fix.
    with pytest.raises(Exception, match="given as chat messages .* set data.chat_template=true"):
        load_data(DataConfig(name="files", train_file=str(file), answer_field="solution"), tok)
    # A file mixing chat messages and plain text: the odd row is named.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        file.read_text() + json.dumps({"prompt": [{"role": "user", "content": 5}], "solution": "5"}) + "\n"
    )
    with pytest.raises(Exception, match=r"Row \d+ of .* is not a list of chat messages with text content"):
        load_data(
            DataConfig(
                name="files", train_file=str(mixed), test_size=1, answer_field="solution", chat_template=True, seed=0
            ),
            tok,
        )


def test_trl_s_own_format_and_accuracy_rewards_train_unchanged_on_conversational_data(chat_dir, tmp_path):
    pytest.importorskip("math_verify", reason="TRL's accuracy_reward needs math_verify (the math extra)")
    file = conversational_jsonl(tmp_path / "chat.jsonl")
    shutil.copy(INPUTS / "trl_rewards.py", tmp_path / "trl_rewards.py")
    run = tmp_path / "run"
    out = grpo_process(
        "train",
        f"model.path={chat_dir}",
        "data=files",
        f"data.train_file={file}",
        "data.test_size=0.25",
        "data.answer_field=solution",
        "data.chat_template=true",
        "reward=python",
        "reward.fn=[trl_rewards.py:think_format_reward,trl_rewards.py:accuracy_reward]",
        "reward.weights=[0.5,2]",
        f"output_dir={run}",
        *ONE_STEP,
        cwd=tmp_path,
        check_rc=0,
    )
    row = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r][0]
    # Each function logged under its own name; the total is their weighted sum.
    assert row["reward/think_format_reward"] == 0.0  # digits never open with <think>
    assert 0.0 <= row["reward/accuracy_reward"] <= 1.0
    assert row["reward_mean"] == pytest.approx(
        0.5 * row["reward/think_format_reward"] + 2 * row["reward/accuracy_reward"]
    )
    samples = read_jsonl(run / "completions.jsonl")
    for s in samples:  # accuracy_reward by hand: math_verify's verdict on the bare number is 1 when it equals the sum
        digits = s["completion"].strip()
        assert s["reward"] in (0.0, 2.0)
        if s["reward"] == 2.0:
            assert digits == s["answer"], s
    assert "string indices" not in out.stderr
    # grpo sample of that run: a prompts file of chat messages, scored by the same two TRL functions
    ask = tmp_path / "ask.jsonl"
    ask.write_text(
        json.dumps(
            {
                "prompt": [{"role": "system", "content": "1"}, {"role": "user", "content": "1+2"}],
                "answer": "3",
                "solution": "3",
            }
        )
        + "\n"
    )
    grpo_process(
        "sample", f"checkpoint={run}", f"prompts_file={ask}", f"output={tmp_path / 's.jsonl'}", cwd=tmp_path, check_rc=0
    )
    sampled = read_jsonl(tmp_path / "s.jsonl")
    assert len(sampled) == 2 and all(r["prompt"] == "1+2" and r["reward"] in (0.0, 2.0) for r in sampled), sampled


def test_two_python_rewards_in_one_file_with_weights_and_a_file_path_found_again_from_elsewhere(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_rewards.py").write_text(
        "def is_number(completions, **kwargs):\n"
        "    return [float(c.strip().isdigit()) for c in completions]\n"
        "def correct(completions, answers, **kwargs):\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answers)]\n"
    )
    run = tmp_path / "run"
    grpo_process(
        "train",
        "reward=python",
        "reward.fn=[my_rewards.py:is_number,my_rewards.py:correct]",
        "reward.weights=[0.25,1]",
        "data.max_operand=9",
        "data.num_test=8",
        f"output_dir={run}",
        *ONE_STEP,
        cwd=work,
        check_rc=0,
    )
    for s in read_jsonl(run / "completions.jsonl"):  # the weighted sum, worked from the completion itself
        want = 0.25 * s["completion"].strip().isdigit() + (s["completion"].strip() == s["answer"])
        assert s["reward"] == pytest.approx(want), s
    row = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r][0]
    assert {"reward/is_number", "reward/correct"} <= set(row)
    # From another directory, evaluate finds the file through the directory the run saved (reward.fn_dir).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = grpo_process(
        "evaluate",
        f"checkpoint={run}/final",
        f"output_dir={tmp_path / 'ev'}",
        "limit=4",
        "samples=0",
        cwd=elsewhere,
        check_rc=0,
    )
    assert "reward >= 1.25" in out.stdout + out.stderr  # the two functions' maxima, weighted: the reward was loaded


def test_reward_fn_mistakes_are_one_sentence(tmp_path):
    (tmp_path / "r.py").write_text("def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    cases = {
        "reward.fn=missing.py:f": "there is no file",
        "reward.fn=r.py:nope": "has no function 'nope'",
        "reward.fn=[r.py:f,r.py:f]": None,  # the same function twice is two terms, f and f_2
        "reward.weights=[1,2,3]": "reward.weights has 3 values for the 1 reward terms",
    }
    for override, message in cases.items():
        extra = ["reward.fn=[r.py:f]"] if override.startswith("reward.weights") else []
        out = grpo_process(
            "train",
            "reward=python",
            override,
            *extra,
            "trainer.steps=1",
            "trainer.prompts_per_step=2",
            "sampler.group_size=2",
            "trainer.eval_before_after=false",
            "trainer.eval_every=0",
            f"output_dir={tmp_path / override.split('=')[0]}_{len(override)}",
            cwd=tmp_path,
        )
        if message is None:
            assert out.returncode == 0, out.stderr[-2000:]
            continue
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, (override, out.stderr)


def test_a_sweep_with_output_dir_keeps_every_job_s_run_prints_the_table_and_exits_2_when_one_fails(tmp_path):
    (tmp_path / "good.py").write_text(
        "def score(completions, **kw):\n    return [float(len(c) % 2) for c in completions]\n"
    )
    (tmp_path / "bad.py").write_text(
        "raise RuntimeError('this reward file is broken')\n"
    )  # found, fails as the job runs
    out = grpo_process(
        "train",
        "-m",
        "reward=python",
        "reward.fn=good.py:score,bad.py:score",
        "output_dir=runs/x",
        *ONE_STEP,
        "trainer.log_completions_every=0",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    sweep = tmp_path / "runs" / "x"
    summaries = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert [s["status"] for s in summaries] == ["done", "failed"]  # each job its own directory: nothing overwritten
    assert (sweep / "0" / "final" / "model.safetensors").exists() and "this reward file is broken" in summaries[1][
        "error"
    ]
    assert "sweep: 2 jobs" in out.stdout and "fn=good.py:score" in out.stdout  # the table
    assert "sweep jobs 1 failed" in out.stderr
    assert "job 0 step 1:" in out.stderr  # the jobs' step lines say whose they are


def test_a_preset_of_one_s_own_under_config_dir_passes_the_pre_check_and_trains(tmp_path):
    presets = tmp_path / "myconf" / "experiment"
    presets.mkdir(parents=True)
    (presets / "mine.yaml").write_text(
        "# @package _global_\ntrainer:\n  steps: 1\n  prompts_per_step: 2\nsampler:\n  group_size: 3\n"
    )
    run = tmp_path / "run"
    grpo_process(
        "train",
        "--config-dir",
        "myconf",
        "experiment=mine",
        f"output_dir={run}",
        "trainer.progress=false",
        "trainer.eval_before_after=false",
        "trainer.eval_every=0",
        cwd=tmp_path,
        check_rc=0,
    )
    row = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r][0]
    assert row["step"] == 1 and row["completion_tokens"] <= 2 * 3 * 6  # the preset's 2 prompts x 3 completions ran
    assert "group_size: 3" in (run / "config.yaml").read_text()
    # a preset that does not parse, a preset dir that is not there, a run directory that cannot be made
    (presets / "broken.yaml").write_text("trainer: [\n")
    for args, message in (
        (["-cd", "myconf", "experiment=broken"], "broken.yaml does not parse as YAML at line 2"),
        (["--config-dir", "nope", "experiment=mine"], "there is no directory"),
        (["output_dir=/sys/x"], "Cannot write to the run directory /sys/x"),
    ):
        out = grpo_process("train", *args, cwd=tmp_path)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_docs_config_dir_and_config_name_examples_compose_as_written(tmp_path):
    """docs/coming-from-trl.md, "Your own config files": its two files, written by its own shell lines, and
    its two commands (with --cfg job): each file's settings, and the command line's over them."""
    import re
    import subprocess

    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    section = page[page.index("## Your own config files") :]
    blocks = re.findall(r"((?:\n    .*)+)", section)
    shell = "\n".join(line[4:] for block in blocks for line in block.splitlines() if line.startswith("    "))
    setup = "\n".join(line for line in shell.splitlines() if not line.startswith("grpo "))
    subprocess.run(["bash", "-c", setup], cwd=tmp_path, check=True)
    commands = [line.split() for line in shell.splitlines() if line.startswith("grpo ")]
    assert len(commands) == 2
    for words, want in zip(
        commands, (["steps: 20", "prompts_per_step: 8", "group_size: 4"], ["steps: 20", "lr: 0.0001"])
    ):
        out = grpo_process(*words[1:], "--cfg", "job", cwd=tmp_path, check_rc=0)
        assert all(w in out.stdout for w in want), (words, out.stdout[-3000:])


@pytest.mark.parametrize(
    "avx512_bf16, amx, ratio, want",
    [
        (False, False, 30.0, "fp32"),  # AVX2 only: bf16 is emulated (this project's CI machines)
        (True, False, 0.6, "bf16-mixed"),  # AVX-512 BF16, confirmed by the probe
        (False, True, 0.3, "bf16-mixed"),  # AMX
        (True, False, 8.0, "fp32"),  # reported, but the probe says slow (a torch build without the kernels)
    ],
)
def test_precision_auto_follows_the_cpu_s_own_capability_report(monkeypatch, avx512_bf16, amx, ratio, want):
    import torch

    from grpo_cli.models import precision

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(precision, "matmul_ratio", lambda device: ratio)
    chosen, why = precision.training_precision("auto", torch.device("cpu"))
    assert chosen.name == want and why.startswith(f"precision: {want} (trainer.precision=auto: ")
    assert (f"{ratio:.2f}x" if want == "bf16-mixed" else "slower than float32") in why
    # an explicit bf16 setting where bf16 is slow is kept, with a warning naming the ratio and the fix
    kept, warning = precision.training_precision("bf16-mixed", torch.device("cpu"))
    assert kept.name == "bf16-mixed" and (warning is None) == (want == "bf16-mixed")
    if warning:
        assert "trainer.precision=auto or fp32 trains faster here" in warning


def test_the_first_lines_of_a_run_say_which_precision_auto_chose_and_why(monkeypatch, capsys, tmp_path):
    import torch

    from grpo_cli.models import precision
    from helpers import FAST

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert grpo("train", "trainer.precision=auto", f"output_dir={tmp_path / 'run'}", *FAST, "trainer.steps=1") == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("precision: ")]
    assert said and said[0].startswith("precision: fp32 (trainer.precision=auto: this CPU has no native bf16 ("), lines
    assert lines.index(said[0]) < next(i for i, line in enumerate(lines) if line.startswith("step 1"))
    assert precision.matmul_ratio(torch.device("cpu")) > 0  # the real probe runs on this machine


def test_help_shows_every_key_with_the_value_this_command_line_gives_and_its_comment():
    out = grpo_process("train", "--help", "model=qwen", "trainer.steps=7", check_rc=0).stdout
    assert "algo: cispo, dapo, dr_grpo, grpo, gspo, sapo, seq_ratio, trl  (now: grpo)" in out
    assert "model: instruct, qwen, tiny  (now: qwen)" in out
    lines = {line.split(" = ")[0]: line for line in out.splitlines() if " = " in line}
    assert lines["trainer.steps"].split("#")[0].split(" = ")[1].strip() == "7"
    assert lines["trainer.steps"].endswith("# GRPO steps (one rollout batch each)")  # the comment in train.yaml
    assert "Qwen/Qwen2.5-0.5B-Instruct" in lines["model.path"]
    assert "# KL weight to the reference policy" in lines["algo.beta"]  # from the algo group's own file
    commented = [k for k, line in lines.items() if "  # " in line]
    assert len(commented) >= 0.95 * len(lines), sorted(set(lines) - set(commented))


def test_a_run_says_what_it_loads_in_order_before_step_1(tmp_path):
    out = grpo_process(
        "train",
        f"output_dir={tmp_path / 'run'}",
        "trainer.steps=1",
        "trainer.prompts_per_step=4",
        "sampler.group_size=2",
        "trainer.progress=false",
        "data.max_operand=9",
        "data.num_test=8",
        "trainer.eval_prompts=8",
        check_rc=0,
    )
    lines = out.stderr.splitlines()
    order = [
        "grpo train: the config is checked",
        "loaded torch",
        "data=arithmetic:",
        "loaded the model builtin:tiny",
        "scoring 8 held-out prompts before training",
        "step 1: sampling 4 prompts x 2",
    ]  # data first: the plan needs it
    where = [next(i for i, line in enumerate(lines) if phrase in line) for phrase in order]
    assert where == sorted(where) and where[0] == 0, lines
    seconds = [float(lines[i].split("s ")[0]) for i in where]
    assert seconds == sorted(seconds)  # each line carries the seconds since the command started


@pytest.mark.timing
def test_help_and_cfg_job_answer_in_under_two_seconds_and_a_run_s_first_line_in_one(tmp_path):
    """The best of three tries each (a shared machine's load spikes are not the product's): the issue's
    targets, --help and --cfg job under 2 s, a run's first line under 1 s (measured 0.5-0.8 s here)."""
    import subprocess
    import sys
    import time

    def best(fn) -> float:
        return min(fn() for _ in range(3))

    def wall(args) -> float:
        start = time.perf_counter()
        grpo_process(*args, check_rc=0)
        return time.perf_counter() - start

    def first_line() -> float:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "grpo_cli.cli",
                "train",
                "trainer.steps=1",
                f"output_dir={tmp_path / 'run'}",
                "overwrite=true",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        line = proc.stderr.readline()
        waited = time.perf_counter() - start
        proc.kill()
        proc.wait()
        assert "grpo train: the config is checked" in line, line
        return waited

    for args in (["train", "--help"], ["train", "--cfg", "job"], ["evaluate", "--help"]):
        assert best(lambda: wall(args)) < 2.0, args
    assert best(first_line) < 1.0


def test_evaluate_and_sample_override_the_saved_settings_key_by_key(tmp_path):
    from dataclasses import asdict

    from grpo_cli.commands.compose import compose_config
    from grpo_cli.commands.inference import with_training_settings
    from grpo_cli.run.checkpoint import CONFIG_FILE, write_config
    from grpo_cli.run.console import Console

    trained = compose_config(
        "train", ["sampler.max_new_tokens=24", "sampler.temperature=0.7", "data.chat_template=true"]
    )
    write_config(tmp_path / CONFIG_FILE, asdict(trained))
    for command in ("sample", "evaluate"):
        for overrides, want in (
            (["sampler.group_size=2"], (2, 24, 0.7)),  # one key over the saved group
            (["sampler=default"], (8, 6, 1.0)),  # the group chosen: the saved one is left out
            ([], (8, 24, 0.7)),
        ):  # nothing said: as trained
            cfg = with_training_settings(
                compose_config(command, overrides), [str(tmp_path)], overrides, Console(progress=False)
            )
            s = cfg.sampler
            assert (s.group_size, s.max_new_tokens, s.temperature) == want, (command, overrides)
            assert cfg.data.chat_template is True


@pytest.mark.parametrize("steps, evals_at", [(3, [0, 2, 3]), (4, [0, 2, 4])])
def test_the_held_out_curve_ends_at_the_last_step_scored_once_and_a_short_run_leaves_completions(
    tmp_path, monkeypatch, steps, evals_at
):
    from grpo_cli.cli import main
    from grpo_cli.rollout.held_out import HeldOut
    from helpers import SMALL, SMALL_DATA

    calls = []
    original = HeldOut.scores
    monkeypatch.setattr(HeldOut, "scores", lambda self: calls.append(1) or original(self))
    run = tmp_path / "run"
    summary = main(
        [
            "train",
            f"output_dir={run}",
            *SMALL,
            *SMALL_DATA,
            f"trainer.steps={steps}",
            "trainer.eval_every=2",
            "trainer.eval_before_after=true",
            "trainer.eval_prompts=8",
            "trainer.log_completions_every=50",
        ]
    )
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == evals_at
    assert len(calls) == len(evals_at)  # the last step's evaluation is not run twice
    assert summary["greedy_accuracy_after"] == evals[-1]["eval/accuracy"]  # the summary's "after" is the curve's end
    assert {r["step"] for r in read_jsonl(run / "completions.jsonl")} == {steps}  # under 50 steps: the last one


def test_the_docs_trl_table_is_the_one_the_suggester_reads():
    from grpo_cli.commands.compose import TRL_NAMES, schema_keys
    from grpo_cli.config import schema_of

    readme = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    keys = set(schema_keys(schema_of("train")))
    for trl, (ours, note) in TRL_NAMES.items():
        assert ours in keys, (trl, ours)  # every target is a real key
        if trl not in ("lr", "steps"):  # aliases for the suggester only
            assert f"| `{trl}` | `{ours}` | {note} |" in readme, trl


def test_the_grpo_script_exits_0_after_a_run_and_prints_no_return_value(tmp_path):
    import subprocess
    import sys

    script = Path(sys.executable).parent / "grpo"
    if not script.exists():
        pytest.skip(f"no grpo script beside {sys.executable} (grpo-cli not installed in this environment)")
    out = subprocess.run(
        [
            str(script),
            "train",
            "trainer.steps=1",
            "trainer.prompts_per_step=2",
            "sampler.group_size=2",
            "trainer.eval_before_after=false",
            "trainer.eval_every=0",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "{'steps'" not in out.stderr + out.stdout, out.stderr[-2000:]
