"""`grpo <train|evaluate|sample> [overrides] [-m] [--cfg job] [--help]`: one Hydra entry per subcommand.

Everything after the subcommand is Hydra's: key=value, +key=value, group=option, -m/--multirun,
--cfg job, --help. The config is turned into the typed dataclasses of config.py once, here, and
the rest of the package takes plain objects.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from grpo_cli.commands.compose import check_command_line, config_file_overrides
from grpo_cli.config import COMMAND_SCHEMAS, register_configs
from grpo_cli.errors import GrpoError
from grpo_cli.run.console import Console
from grpo_cli.run.stopping import Stopped

COMMANDS = {
    "train": "post-train a model with GRPO",
    "evaluate": "greedy and sampled accuracy, pass@k, maj@k and mean reward of checkpoints on a data split",
    "sample": "completions from a checkpoint for given prompts, scored when an answer is given",
    "tools": "the tool-call format of a model's chat template, and whether each format reads its calls back",
}
CONFIG_OF = {"tools": "train"}  # grpo tools composes train's config: the model (and env) named as there
USAGE = (
    "usage: grpo <command> [key=value ...] [group=option ...] [-m] [--cfg job] [--help]\n       grpo "
    "--version\n\ncommands:\n"
    + "\n".join(f"  {name:<9} {what}" for name, what in COMMANDS.items())
    + "\n\n`grpo <command> --help` lists that command's config groups and options."
)

# `eval "$(grpo --completion bash)"`: the subcommand, then Hydra's own completion of that command's config
# (groups, keys, options), asked with the subcommand taken out of the line as Hydra expects.
COMPLETION = r"""_grpo_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "train evaluate sample tools --help --version --completion" -- "$cur"))
        return
    fi
    local cmd="${COMP_WORDS[1]}"
    local rest="${COMP_LINE#*$cmd}"
    local choices
    choices=$(COMP_LINE="grpo$rest" COMP_POINT=$COMP_POINT grpo "$cmd" -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "$cur"))
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _grpo_complete grpo"""
ZSH_PREAMBLE = "autoload -U +X bashcompinit && bashcompinit\n"

_job_started = False  # a Hydra exit before any job started is a composition (user) error
_result = None  # what the last job returned (the run summary, eval.json's content, the samples): main returns it
_error: str | None = None  # the last user mistake's sentence, for the Python API (grpo_cli.api) to raise
_dist = None  # the process group under torchrun (torchrun.TorchDist), else None


def _run(command: str, cfg) -> object:
    global _result
    try:
        _result = _job(command, cfg)
    finally:
        _drop_empty_run_dir()
    return _result


def _drop_empty_run_dir() -> None:
    """Hydra makes runs/<time> (runs/evaluate/<time>) before the job starts. A job that wrote nothing there (a
    mistake found once the command started, resume=PATH continuing in the checkpoint's own directory) leaves
    no empty directory behind. Only that directory of Hydra's naming goes: not one named with
    hydra.run.dir or output_dir (which sets it), not the working directory (`grpo sample` and `grpo tools`
    run in place), not a sweep's."""
    hydra_cfg = HydraConfig.get()
    named = any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir" for o in hydra_cfg.overrides.hydra)
    if hydra_cfg.mode == RunMode.MULTIRUN or named:
        return
    made = Path(hydra_cfg.runtime.output_dir)
    if made.resolve() == Path.cwd().resolve() or not made.is_dir() or any(made.iterdir()):
        return
    try:
        made.rmdir()
    except OSError:  # another rank of the run wrote into it (or removed it) in between: its files stay
        return


def _job(command: str, cfg) -> object:
    global _job_started, _error
    _job_started = True
    from grpo_cli.models.runtime import prepare_libraries

    prepare_libraries()  # here, not before Hydra: --help and --cfg never pay for importing transformers
    rank = _dist.rank if _dist is not None else 0
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    console = Console(
        progress=bool(OmegaConf.select(cfg, "trainer.progress", default=True)),
        quiet=rank > 0,
        label=f"job {HydraConfig.get().job.num} " if in_sweep else "",
    )
    try:
        # A sweep's job always writes its own directory (output_dir became the sweep's directory: _run_directory).
        out_dir = (
            Path(cfg.output_dir)
            if cfg.get("output_dir") and not in_sweep
            else Path(HydraConfig.get().runtime.output_dir)
        )
        return _command(command, OmegaConf.to_object(cfg), out_dir, console, rank, in_sweep)
    except GrpoError as e:
        where = f"rank {rank}: " if _dist is not None and _dist.world_size > 1 else ""
        console.error(f"{where}{e}")
        _error = f"{where}{e}"
        if in_sweep:  # a failed job is reported in the sweep table; the other jobs still run
            if rank == 0:
                write_job_summary(out_dir, {"status": "failed", "error": str(e)})
            return float("nan") if OmegaConf.select(cfg, "objective") else {"status": "failed", "error": str(e)}
        sys.exit(2)
    except Stopped as e:
        console.print(f"[bold yellow]{e}[/]")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except Exception as e:
        from grpo_cli.models.torchrun import peer_failure

        if _dist is None or not peer_failure(e):
            raise
        # Another rank died (or stopped answering): say so and exit instead of waiting forever.
        console.error(
            f"rank {rank}: another rank stopped ({type(e).__name__}: {str(e).splitlines()[0][:200]}), so this "
            "rank stops too; see that rank's output, then continue with resume=auto."
        )
        sys.exit(1)


def _command(command: str, plain, out_dir: Path, console: Console, rank: int, in_sweep: bool) -> object:
    """The command's work on its checked config; what it returns is the job's result."""
    overrides = list(HydraConfig.get().overrides.task)
    if command == "train":
        from grpo_cli.models.distributed import SINGLE
        from grpo_cli.run.trainer import train

        summary = train(plain, out_dir, console, _dist or SINGLE, command=f"grpo train {' '.join(overrides)}".strip())
        console.summary(summary)
        if in_sweep and rank == 0:
            write_job_summary(out_dir, {"status": "done", **summary})
        return float(summary[plain.objective]) if plain.objective else summary
    if command == "tools":
        from grpo_cli.commands.tools import run_tools

        return run_tools(plain, console)
    if command == "evaluate":
        from grpo_cli.commands.evaluation import run_evaluate

        return run_evaluate(plain, out_dir, console, overrides=overrides)
    from grpo_cli.commands.sampling import run_sample

    return run_sample(plain, console, overrides=overrides)


def write_job_summary(out_dir: Path, row: dict) -> None:
    """summary.json in a sweep job's directory: what the sweep's table is built from, whichever launcher
    ran the job (in this process, joblib workers, Slurm through submitit)."""
    from grpo_cli.commands import SUMMARY_FILE

    job = HydraConfig.get().job
    row = {"job": job.num, "overrides": list(HydraConfig.get().overrides.task), **row, "run_dir": str(out_dir)}
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / SUMMARY_FILE).write_text(json.dumps(row, indent=1) + "\n")
    except OSError as e:  # the job's result is still printed; only the sweep table will miss it
        Console(progress=False).warn(
            f"could not write {Path(out_dir) / SUMMARY_FILE} ({e.strerror}); the sweep table will not list this job"
        )


def _entry(command: str):
    @hydra.main(version_base="1.3", config_path="pkg://grpo_cli.conf", config_name=CONFIG_OF.get(command, command))
    def entry(cfg) -> object:
        return _run(command, cfg)

    return entry


def import_plugins(overrides: list[str]) -> None:
    """Imports the files and modules `plugins=[...]` names on the command line, before it is checked."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from grpo_cli.registry import import_plugin

    named = [a for a in overrides if a.lstrip("+~").startswith("plugins=")]
    for override in OverridesParser.create().parse_overrides(named):
        value = override.value()
        for spec in value if isinstance(value, list) else [value]:
            import_plugin(str(spec))


def main(argv: list[str] | None = None) -> object:
    """`grpo ARGV`, and exits (SystemExit) with 2 on a user mistake, as the command does. Called with `argv`
    (from Python), it returns what the job returned (train: the run summary; evaluate: the scores; sample:
    the completions; a sweep: None); as the `grpo` script (no argv) it returns None, which the script's
    sys.exit(main()) takes for exit code 0."""
    from_python = argv is not None
    global _job_started, _result, _error
    _job_started, _result, _error = False, None, None
    import grpo_cli.run.console

    grpo_cli.run.console.STARTED = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    if _answered_without_a_job(argv):
        return None
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean grpo {close[0]}?" if close else f"the commands are {', '.join(COMMANDS)}"
        print(f"error: unknown command {command!r}; {hint} (grpo --help describes each).", file=sys.stderr)
        sys.exit(2)
    config = CONFIG_OF.get(command, command)
    register_configs(config)
    if "--help" in rest or "-h" in rest:  # ours, with each key's comment; --hydra-help is Hydra's
        from grpo_cli.commands.help import print_help

        sys.exit(print_help(config, rest))
    try:  # composition errors and bad values: one sentence, before torch is imported
        rest = config_file_overrides(rest)  # --config FILE: its settings first, the command line's win
        import_plugins(rest)  # what they register (generator=NAME among it) is known before the check
        check_command_line(config, rest, COMMAND_SCHEMAS[config])
        rest = _run_directory(command, rest) if command == config else [*rest, "hydra.run.dir=."]
    except GrpoError as e:
        Console(progress=False).error(str(e))
        _error = str(e)
        sys.exit(2)
    if command == "train" and not any(a in ("--cfg", "-c", "--info", "-i") for a in rest):  # the first line, at once
        Console(progress=False, quiet=os.environ.get("RANK", "0") != "0").phase(
            "grpo train: the config is checked; loading torch and transformers"
        )
    rest = _join_process_group(command, rest)
    sys.argv = [f"grpo {command}"] + rest
    try:
        _entry(command)()
        from grpo_cli.commands import failed_jobs  # filled by a multirun's callback alone

        if failed_jobs:
            print(f"error: sweep jobs {', '.join(failed_jobs)} failed (see the table above).", file=sys.stderr)
            sys.exit(2)
        return None if not from_python or any(a in ("-m", "--multirun") for a in rest) else _result
    except SystemExit as e:
        # Hydra reports a bad override or config itself (no trace) and exits 1; that is a user
        # mistake, so exit 2 like every other one. A crash inside a job keeps Hydra's code.
        if e.code == 1 and not _job_started:
            sys.exit(2)
        raise
    finally:
        if _dist is not None:
            from grpo_cli.generate.base import close_all

            close_all()  # an engine sharing the process group (vLLM) goes before it
            _dist.close()


def _answered_without_a_job(argv: list[str]) -> bool:
    """Usage, the version and shell completion: answered here (exiting where the answer is an exit code).
    True when the completion script asked Hydra and was answered."""
    if not argv:  # a bare `grpo`: one sentence and where to go next
        print(
            "error: no command given; run grpo train (the built-in default run), or grpo --help for the commands.",
            file=sys.stderr,
        )
        sys.exit(2)
    if argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0)
    if argv[0] == "--completion" or (
        len(argv) > 1 and argv[1] in ("--shell-completion", "-sc") and any(a.startswith("install=") for a in argv[2:])
    ):
        shell = (
            argv[1]
            if argv[0] == "--completion" and len(argv) > 1
            else next((a.split("=", 1)[1] for a in argv[2:] if a.startswith("install=")), "bash")
        )
        if shell not in ("bash", "zsh"):
            print(f"error: completion for {shell!r} is not available; use bash or zsh.", file=sys.stderr)
            sys.exit(2)
        print(COMPLETION if shell == "bash" else ZSH_PREAMBLE + COMPLETION)
        sys.exit(0)
    if len(argv) > 1 and argv[1] in ("-sc", "--shell-completion"):  # the completion script asking Hydra
        import grpo_cli.generate.base  # noqa: F401 - registers the generator back-ends' options

        register_configs(CONFIG_OF.get(argv[0], argv[0]))
        sys.argv = [f"grpo {argv[0]}"] + argv[1:]
        _entry(argv[0])()
        return True
    if argv[0] in ("-V", "--version", "version"):
        from importlib.metadata import version

        print(f"grpo-cli {version('grpo-cli')}")
        sys.exit(0)
    return False


def _join_process_group(command: str, overrides: list[str]) -> list[str]:
    """Under torchrun: join the process group, and make every rank use rank 0's run directory (Hydra's
    ${now:...} differs between ranks), with only rank 0 writing Hydra's .hydra/ and log."""
    global _dist
    if not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):  # distributed.launched(), without importing torch
        return overrides
    from grpo_cli.models.torchrun import from_environment

    if command != "train":
        print(f"error: grpo {command} runs in one process; launch it without torchrun.", file=sys.stderr)
        sys.exit(2)
    if any(o in ("-m", "--multirun") for o in overrides):
        print(
            "error: a sweep (-m) cannot run under torchrun; launch each job with torchrun, or use a launcher such "
            "as hydra/launcher=submitit_slurm whose jobs are torchrun runs.",
            file=sys.stderr,
        )
        sys.exit(2)
    _dist = from_environment()
    given = [o for o in overrides if o.split("=", 1)[0] in ("hydra.run.dir", "output_dir")]
    if not given:
        import time

        stamp = _dist.broadcast_object(time.strftime("%Y-%m-%d_%H-%M-%S") if _dist.is_main else None)
        overrides = [*overrides, f"hydra.run.dir=runs/{stamp}"]
    if not _dist.is_main:
        overrides = [*overrides, "hydra/hydra_logging=disabled"]
    return overrides


DEFAULT_RUN_ROOTS = {"train": "runs", "evaluate": "runs/evaluate"}


def _run_directory(command: str, overrides: list[str]) -> list[str]:
    """`output_dir=X` is also Hydra's run directory, so nothing goes to runs/<time>/ beside it; in a sweep
    (-m) it is the sweep's directory, each job writing X/<job number>/ with its summary, so no job refuses
    or overwrites another's run. The run directory must be one that can be made and written, which is
    checked before Hydra makes it."""
    if command not in DEFAULT_RUN_ROOTS:
        return overrides
    given = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("-"))
    sweep = any(o in ("-m", "--multirun") for o in overrides)
    run_key = "hydra.sweep.dir" if sweep else "hydra.run.dir"  # in a sweep output_dir holds one directory per job
    target = given.get(run_key) or given.get("output_dir")
    if given.get("output_dir") and run_key not in given:  # beside output_dir: Hydra takes its overrides in one run
        at = next(i for i, o in enumerate(overrides) if o.startswith("output_dir=")) + 1
        overrides = [*overrides[:at], f"{run_key}='{given['output_dir']}'", *overrides[at:]]
    if sweep and not target:
        return overrides
    path = Path(str(target).strip("'\"") if target else DEFAULT_RUN_ROOTS[command]).expanduser()
    existing = next(p for p in [path, *path.parents] if p.exists())
    why = (
        f"{existing} is not a directory"
        if not existing.is_dir()
        else f"{existing} is not writable"
        if not os.access(existing, os.W_OK)
        else None
    )
    if why is None:
        try:  # access() says yes to root everywhere; /sys and read-only mounts only refuse the attempt
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = f"{(e.strerror or str(e)).lower()} there"
    if why:
        raise GrpoError(f"Cannot write to the run directory {path} ({why}); choose another with output_dir=DIR.")
    return overrides


if __name__ == "__main__":
    main()
