"""Every `grpo` command in the README and the docs works as written: each one is composed and checked exactly as the
CLI does before it runs anything (so a key, option or value that does not exist fails here), and the ones
that need neither a network, a GPU, a cluster nor a big model are run for real, shortened by overrides."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.cli import CONFIG_OF, main
from grpo_cli.commands.compose import check_command_line, config_file_overrides
from grpo_cli.config import register_configs, schema_of
from helpers import docs_text

SHORT = {
    "trainer.steps": "2",
    "trainer.eval_prompts": "8",
    "trainer.progress": "false",
    "data.num_test": "20",
    "data.max_operand": "9",
    "trainer.log_completions_every": "0",
    "trainer.eval_every": "0",
}


def readme_commands() -> list[str]:
    """`grpo ...` and `torchrun ... -m grpo_cli ...` lines of the README's and the docs' code (continuations
    joined, comments dropped, the usage line with [overrides] left out), each once."""
    lines, out, joined, output = docs_text().splitlines(), [], "", False
    for line in lines:
        text = line.strip()
        if text.startswith("```"):  # a ```text block shows what a command printed, not a command
            output = text == "```text"
            continue
        if output:
            continue
        if joined:
            text, joined = joined + " " + text, ""
        if text.endswith("\\"):
            joined = text[:-1].rstrip()
            continue
        text = re.sub(r"\s+#.*$", "", text)
        is_cli = text.startswith("grpo ") or re.search(r"(^|\s)torchrun .*-m grpo_cli ", text)
        # --config-dir needs the user's files: test_first_hour runs those examples with the files the page writes
        own_files = "--config-dir" in text
        if is_cli and "[overrides]" not in text and "|" not in text and not own_files and text.strip() not in out:
            out.append(text.strip())
    return out


COMMANDS = readme_commands()


def args_of(command: str) -> tuple[str, list[str]]:
    command = command.replace("<time>", "2026-11-22_10-00-00")  # the README's placeholder for a run directory
    words = shlex.split(command.replace("$SLURM_JOB_ID", "1").replace('"$head:29500"', "h:29500"))
    words = words[words.index("grpo_cli") + 1 :] if "grpo_cli" in words else words[1:]
    return words[0], words[1:]


def test_the_readme_has_the_commands_this_test_expects():
    assert len(COMMANDS) >= 30, COMMANDS
    assert any(c.startswith("grpo train data=files data.train_file=qs.jsonl") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_composes_and_passes_the_checks(command, tmp_path, monkeypatch):
    register_configs()
    sub, args = args_of(command)
    if sub.startswith("-"):  # grpo --version, grpo --completion
        return
    # The reward files a command names are the user's (the README writes my_rewards.py above it; trl_rewards.py
    # holds TRL's functions): the checks look for them where grpo runs, so they are there, empty.
    monkeypatch.chdir(tmp_path)
    for name in set(re.findall(r"([\w./-]+\.py):", command)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    if "--config" in args:  # the file a user would have written: settings first, the command line's win
        (tmp_path / args[args.index("--config") + 1]).write_text("trainer:\n  steps: 3\nsampler.group_size: 4\n")
        args = config_file_overrides(args)
    sub = CONFIG_OF.get(sub, sub)  # grpo tools composes train's config
    # raises GrpoError with the sentence a user would see; the docs' paths (/models/my-sft) are examples, so
    # what the disk holds is not checked here (tests/e2e/test_bad_input.py checks that)
    check_command_line(sub, args, schema_of(sub), disk=False)


def shortened(args: list[str], extra: dict[str, str]) -> list[str]:
    keys = {a.split("=", 1)[0] for a in args if "=" in a}
    return args + [f"{k}={v}" for k, v in extra.items() if k not in keys]


def run(args: list[str], cwd: Path) -> None:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as e:
            main(args)
            raise SystemExit(0)
    finally:
        os.chdir(old)
    assert e.value.code in (0, None), args


def test_the_offline_readme_commands_run_as_written_shortened(tmp_path):
    """The data and reward examples as a new user types them, then evaluate and sample on their run."""
    text = docs_text()
    loop = next(line for line in text.splitlines() if line.startswith("for a in $(seq 1 40)"))
    subprocess.run(["bash", "-c", loop], cwd=tmp_path, check=True)
    reward = text[text.index("cat > my_rewards.py <<'EOF'") :].split("\n", 1)[1].split("\nEOF\n", 1)[0]
    (tmp_path / "my_rewards.py").write_text(reward + "\n")
    sys.path.insert(0, str(tmp_path))
    short = {k: v for k, v in SHORT.items() if not k.startswith("data.")}
    for command in COMMANDS:
        sub, args = args_of(command)
        if command.startswith("grpo train data=files data.train_file=qs.jsonl"):
            run(["train", *shortened(args, short), "output_dir=run_files"], tmp_path)
        elif command.startswith(("grpo train reward=python", "grpo train reward=combo")):
            name = f"run_{args[0].split('=')[1]}"  # the first run of a reward keeps the plain name (sampled below)
            run(
                [
                    "train",
                    *shortened(args, SHORT),
                    f"output_dir={name}_{len(args) if (tmp_path / name).exists() else ''}".rstrip("_"),
                ],
                tmp_path,
            )
    assert (tmp_path / "run_files" / "final" / "README.md").exists()
    # evaluate and sample a run as the README shows them, with runs/<time> being that run
    run(["evaluate", "checkpoint=run_files", "samples=2", "k=[1,2]", "limit=4"], tmp_path)
    run(["sample", "checkpoint=run_python/final", "prompt='12+30='", "answer=42"], tmp_path)
    run(["evaluate", "checkpoint=[builtin:tiny,run_combo/final]", "samples=2", "k=[1,2]", "limit=4"], tmp_path)
