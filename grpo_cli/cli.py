"""`grpo <train|evaluate|sample> [overrides] [-m] [--cfg job] [--help]`: one Hydra entry per subcommand.

Everything after the subcommand is Hydra's: key=value, +key=value, group=option, -m/--multirun,
--cfg job, --help. The config is turned into the typed dataclasses of config.py once, here, and
the rest of the package takes plain objects.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf
from rich.markup import escape

from grpo_cli.config import register_configs
from grpo_cli.console import Console
from grpo_cli.errors import GrpoError
from grpo_cli.stopping import Stopped

COMMANDS = {
    "train": "post-train a model with GRPO",
    "evaluate": "greedy and sampled accuracy, pass@k, maj@k and mean reward of checkpoints on a data split",
    "sample": "completions from a checkpoint for given prompts, scored when an answer is given",
}
USAGE = "usage: grpo <command> [key=value ...] [group=option ...] [-m] [--cfg job] [--help]\n\ncommands:\n" + "\n".join(
    f"  {name:<9} {what}" for name, what in COMMANDS.items()
) + "\n\n`grpo <command> --help` lists that command's config groups and options."

_job_started = False  # a Hydra exit before any job started is a composition (user) error


def _run(command: str, cfg) -> object:
    global _job_started
    _job_started = True
    console = Console(progress=bool(OmegaConf.select(cfg, "trainer.progress", default=True)))
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        out_dir = Path(cfg.output_dir) if cfg.get("output_dir") else Path(HydraConfig.get().runtime.output_dir)
        plain = OmegaConf.to_object(cfg)
        if command == "train":
            from grpo_cli.trainer import train

            summary = train(plain, out_dir, console)
            console.summary(summary)
            return summary
        if command == "evaluate":
            from grpo_cli.evaluate import run_evaluate

            return run_evaluate(plain, out_dir, console)
        from grpo_cli.sample import run_sample

        return run_sample(plain, console)
    except GrpoError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)  # brackets are text
        if in_sweep:  # a failed job is reported in the sweep table; the other jobs still run
            return {"status": "failed", "error": str(e)}
        sys.exit(2)
    except Stopped as e:
        console.print(f"[bold yellow]{e}[/]")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]")
        sys.exit(130)


def _entry(command: str):
    @hydra.main(version_base="1.3", config_path="pkg://grpo_cli.conf", config_name=command)
    def entry(cfg) -> object:
        return _run(command, cfg)

    return entry


def quiet_libraries() -> None:
    """Our progress bar is the one that matters; transformers' per-load bars are noise here."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> None:
    global _job_started
    _job_started = False
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}.\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    register_configs()
    quiet_libraries()
    sys.argv = [f"grpo {command}"] + rest
    try:
        _entry(command)()
        from grpo_cli.sweep import failed_jobs

        if failed_jobs:
            print(f"error: sweep jobs {', '.join(failed_jobs)} failed (see the table above).", file=sys.stderr)
            sys.exit(2)
    except SystemExit as e:
        # Hydra reports a bad override or config itself (no trace) and exits 1; that is a user
        # mistake, so exit 2 like every other one. A crash inside a job keeps Hydra's code.
        if e.code == 1 and not _job_started:
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
