"""The CLI end to end: real `grpo` entry points on a freshly built tiny model (no network)."""

import json
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.models.loading import resolve_path
from helpers import FAST, TIMING
from helpers import grpo as grpo_in_process
from helpers import grpo_process as grpo
from helpers import read_jsonl as read_rows


def run_in_process(*args):
    code = grpo_in_process(*args)
    assert code == 0, f"grpo {' '.join(args)} exited {code}"


def test_a_few_real_steps_change_the_weights_and_write_metrics_and_a_loadable_checkpoint(tmp_path):
    run_in_process("train", f"output_dir={tmp_path}", "trainer.save_every=1", *FAST)
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward_mean",
        "reward_std",
        "accuracy",
        "zero_var_frac",
        "kl",
        "clip_frac_low",
        "clip_frac_high",
        "completion_len",
        "lr",
        "grad_norm",
        "seconds",
        "tokens_per_s",
    ):
        assert all(key in r for r in rows), key
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-2"
    state = torch.load(tmp_path / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2 and {"optimizer", "scheduler", "rng"} <= set(state)
    before = AutoModelForCausalLM.from_pretrained(resolve_path("builtin:tiny"))
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step-2")
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    changed = [n for (n, p), q in zip(before.named_parameters(), after.parameters()) if not torch.equal(p, q)]
    assert changed, "two GRPO steps left every parameter unchanged"
    assert all(torch.equal(p, q) for p, q in zip(after.parameters(), final.parameters()))


def test_the_same_seed_and_config_give_the_same_run(tmp_path):
    for name in ("a", "b"):
        run_in_process("train", f"output_dir={tmp_path / name}", *FAST)
    a, b = (
        [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(tmp_path / n / "metrics.jsonl")]
        for n in ("a", "b")
    )
    assert a == b


def test_a_mistyped_config_key_exits_2_naming_the_key_without_a_stack_trace():
    out = grpo("train", "trainer.stepz=3", check_rc=2)
    assert "stepz" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout


def test_a_wrong_type_exits_2_naming_the_key():
    out = grpo("train", "trainer.steps=many", check_rc=2)
    assert "trainer.steps" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.path=/nonexistent/model", "does not exist"),
        ("sampler.group_size=1", "group_size must be at least 2"),
        ("data.prompt_field=question", "'question' is missing"),
        ("algo.aggregation=seq_mean", "algo.aggregation='seq_mean' must be one of seq_mean_token_mean"),
    ],
)
def test_user_mistakes_are_one_clear_sentence_and_exit_2(override, message, tmp_path):
    out = grpo("train", f"output_dir={tmp_path}", *FAST, override, check_rc=2)
    assert message in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_an_unwritable_output_dir_is_reported_before_any_work(tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = grpo("train", f"model.path={tiny_dir}", f"output_dir={blocker}/run", *FAST, check_rc=2)
    assert "Cannot write to the run directory" in out.stdout + out.stderr


def test_a_model_directory_of_an_unknown_architecture_is_one_sentence(tmp_path):
    from grpo_cli.errors import GrpoError
    from grpo_cli.models.loading import load_model, load_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    with pytest.raises(GrpoError, match="^Could not load a tokenizer from "):
        load_tokenizer(str(tmp_path))
    with pytest.raises(GrpoError, match="^Could not load a model from .*no_such_architecture"):
        load_model(str(tmp_path), device="cpu")


def test_help_lists_the_config_groups_and_their_options():
    out = grpo("train", "--help", check_rc=0)
    for line in (
        "algo: cispo, dapo, dr_grpo, grpo, gspo, sapo, seq_ratio",
        "model: instruct, qwen, tiny",
        "reward: auto, code, combo, exact_match, format, length, math, model, none, python",
        "sampler: default",
        "optimizer: adamw",
        "data: arithmetic, code, files, gsm8k, hub, links, long_addition, none",
    ):
        assert line in out.stdout


def test_cfg_job_prints_the_composed_config_with_overrides_applied():
    out = grpo("train", "--cfg", "job", "model=qwen", "sampler.group_size=16", check_rc=0)
    assert "path: Qwen/Qwen2.5-0.5B-Instruct" in out.stdout and "group_size: 16" in out.stdout


def test_an_unknown_or_missing_command_is_one_sentence_with_a_hint():
    out = grpo("trian", check_rc=2)
    assert (
        out.stderr.strip() == "error: unknown command 'trian'; did you mean grpo train? (grpo --help describes each)."
    )
    out = grpo("frobnicate", check_rc=2)
    assert out.stderr.strip() == (
        "error: unknown command 'frobnicate'; the commands are train, evaluate, sample, tools "
        "(grpo --help describes each)."
    )
    out = grpo(check_rc=2)
    assert len(out.stderr.strip().splitlines()) == 1 and "grpo train" in out.stderr and not out.stdout
    assert "commands:" in grpo("--help", check_rc=0).stdout


@pytest.mark.slow
def test_multirun_runs_one_job_per_combination(tiny_dir, tmp_path):
    grpo(
        "train",
        "-m",
        f"model.path={tiny_dir}",
        "trainer.seed=0,1",
        "trainer.steps=1",
        *[a for a in FAST if not a.startswith("trainer.steps")],
        f"hydra.sweep.dir={tmp_path}",
        check_rc=0,
    )
    for job in ("0", "1"):
        assert len(read_rows(tmp_path / job / "metrics.jsonl")) == 1


def test_evaluate_writes_eval_json_and_sample_shows_scored_completions(tiny_dir, tmp_path):
    grpo(
        "evaluate",
        f"checkpoint={tiny_dir}",
        "data.max_operand=9",
        "data.num_test=20",
        f"output_dir={tmp_path}",
        check_rc=0,
    )
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["num_prompts"] == 20 and 0.0 <= result["rows"][0]["accuracy"] <= 1.0
    out = grpo(
        "sample",
        f"checkpoint={tiny_dir}",
        "prompt='3+4='",
        "answer=7",
        "sampler.group_size=3",
        f"output={tmp_path / 's.jsonl'}",
        check_rc=0,
    )
    rows = read_rows(tmp_path / "s.jsonl")
    assert len(rows) == 3 and all(r["prompt"] == "3+4=" and r["reward"] in (0.0, 1.0) for r in rows)
    assert "3+4=" in out.stdout


def test_a_local_model_directory_of_another_architecture_trains(tmp_path):
    """model.path= takes any Hugging Face causal LM directory (here a random tiny Qwen2, built offline)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tiny_models import tiny

    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )
    tiny.save(model, tok, tmp_path / "qwen")
    run_in_process("train", f"model.path={tmp_path / 'qwen'}", f"output_dir={tmp_path / 'run'}", *FAST)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"


def test_outside_a_terminal_progress_is_a_plain_line_per_log_every_steps(tmp_path):
    out = grpo(
        "train",
        f"output_dir={tmp_path}",
        *FAST,
        "trainer.steps=4",
        "trainer.log_every=2",
        "trainer.progress=true",
        check_rc=0,
    )
    lines = [line for line in out.stderr.splitlines() if re.match(r"step \d+/\d+ ", line)]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"], out.stderr
    assert all(" reward " in line and " s/step " in line and " eta " in line for line in lines)


def test_outside_a_terminal_a_long_warning_stays_on_one_line(capsys):
    from grpo_cli.run.console import Console

    message = "this warning is long " * 12  # ~250 characters, far past 80 columns
    Console().warn(message.strip())
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.strip() in err


def test_version_and_python_dash_m_work():
    from importlib.metadata import version

    out = subprocess.run([sys.executable, "-m", "grpo_cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"grpo-cli {version('grpo-cli')}", out.stdout + out.stderr


def test_bash_completion_completes_the_subcommand_and_then_its_config(tmp_path):
    import os
    import shutil

    if shutil.which("bash") is None:
        pytest.skip("bash is not installed here")
    script = tmp_path / "complete.sh"
    script.write_text(
        'eval "$(grpo --completion bash)"\n'
        + r"""
complete_line() {
  COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}
  read -ra COMP_WORDS <<< "$COMP_LINE"
  if [[ "$COMP_LINE" == *" " ]]; then COMP_WORDS+=(""); fi
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  _grpo_complete
  echo "${COMPREPLY[*]}"
}
complete_line "grpo ev"
complete_line "grpo train mod"
complete_line "grpo train model="
complete_line "grpo sample checkp"
"""
    )
    bin_dir = os.path.dirname(sys.executable)
    out = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert out.stdout.splitlines() == [
        "evaluate",
        "model. model=",
        "model=instruct model=qwen model=tiny",
        "checkpoint=",
    ], out


def test_hydra_s_completion_install_prints_the_working_script():
    out = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "train", "--shell-completion", "install=bash"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "complete -o nospace -o default -F _grpo_complete grpo" in out.stdout
    zsh = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "--completion", "zsh"], capture_output=True, text=True, timeout=60
    )
    assert zsh.stdout.startswith("autoload -U +X bashcompinit && bashcompinit")


def test_the_run_directory_is_the_one_place_a_run_writes(tmp_path):
    """With output_dir=X nothing lands in the current directory (no runs/, .hydra/ or log); X holds the
    resolved config.yaml, as does every checkpoint and final/."""
    cwd, run = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "train", f"output_dir={run}", *FAST, "trainer.save_every=1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(cwd.iterdir()) == []
    for where in (run, run / "checkpoints" / "step-1", run / "final"):
        saved = (where / "config.yaml").read_text()
        assert "trainer:" in saved and "steps: 2" in saved, where


def test_config_file_settings_come_first_and_the_command_line_wins(tmp_path):
    """`--config FILE` (TRL's habit): a group's option, nested and dotted keys; a key the command line also
    sets takes the command line's value, and `--cfg job` anywhere still works."""
    import yaml

    recipe = tmp_path / "run.yaml"
    recipe.write_text(
        "model: qwen\ntrainer:\n  steps: 50\n  seed: 3\nsampler.group_size: 16\n"
        "reward:\n  format_pattern: '<a>\\s*</a>'\n"
    )
    out = grpo("train", "--config", str(recipe), "--cfg", "job", "trainer.steps=7", check_rc=0)
    job = yaml.safe_load(out.stdout)
    assert job["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct" and job["trainer"]["steps"] == 7
    assert job["trainer"]["seed"] == 3 and job["sampler"]["group_size"] == 16
    assert job["reward"]["format_pattern"] == "<a>\\s*</a>"
    out = grpo("train", f"--config={recipe}", f"output_dir={tmp_path / 'x'}", "--cfg", "job", check_rc=0)
    assert yaml.safe_load(out.stdout)["output_dir"] == str(tmp_path / "x")


def test_a_run_s_own_config_yaml_composes_back_to_the_same_config(tmp_path):
    import yaml

    run = tmp_path / "run"
    grpo("train", *FAST, f"output_dir={run}", "optimizer.lr=0.0002", check_rc=0)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    again = yaml.safe_load(grpo("train", "--config", str(run / "config.yaml"), "--cfg", "job", check_rc=0).stdout)
    assert again == saved


@pytest.mark.parametrize(
    "text, phrase",
    [(None, "No such file"), ("a: [1,\n", "is not valid YAML"), ("- 1\n- 2\n", "holds a list, not settings")],
)
def test_a_config_file_that_cannot_be_read_is_one_sentence(tmp_path, text, phrase):
    path = tmp_path / "run.yaml"
    if text is not None:
        path.write_text(text)
    out = grpo("train", "--config", str(path), check_rc=2)
    assert phrase in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
