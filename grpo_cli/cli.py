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

from grpo_cli.compose import check_command_line
from grpo_cli.config import EvaluateConfig, SampleConfig, TrainConfig, register_configs
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

SCHEMAS = {"train": TrainConfig, "evaluate": EvaluateConfig, "sample": SampleConfig}
_job_started = False  # a Hydra exit before any job started is a composition (user) error
_dist = None  # the process group under torchrun (distributed.TorchDist), else None


def _run(command: str, cfg) -> object:
    global _job_started
    _job_started = True
    rank = _dist.rank if _dist is not None else 0
    console = Console(progress=bool(OmegaConf.select(cfg, "trainer.progress", default=True)), quiet=rank > 0)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        out_dir = Path(cfg.output_dir) if cfg.get("output_dir") else Path(HydraConfig.get().runtime.output_dir)
        plain = OmegaConf.to_object(cfg)
        if command == "train":
            from grpo_cli.distributed import SINGLE
            from grpo_cli.trainer import train

            summary = train(plain, out_dir, console, _dist or SINGLE)
            console.summary(summary)
            return summary
        if command == "evaluate":
            from grpo_cli.evaluate import run_evaluate

            return run_evaluate(plain, out_dir, console)
        from grpo_cli.sample import run_sample

        return run_sample(plain, console)
    except GrpoError as e:
        where = f"rank {rank}: " if _dist is not None and _dist.world_size > 1 else ""
        console.error(f"{where}{e}")
        if in_sweep:  # a failed job is reported in the sweep table; the other jobs still run
            return {"status": "failed", "error": str(e)}
        sys.exit(2)
    except Stopped as e:
        console.print(f"[bold yellow]{e}[/]")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except Exception as e:
        from grpo_cli.distributed import peer_failure

        if _dist is None or not peer_failure(e):
            raise
        # Another rank died (or stopped answering): say so and exit instead of waiting forever.
        console.error(f"rank {rank}: another rank stopped ({type(e).__name__}: {str(e).splitlines()[0][:200]}), so this "
                      "rank stops too; see that rank's output, then continue with resume=auto.")
        sys.exit(1)


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
    try:  # composition errors and bad values: one sentence, before torch is imported
        check_command_line(command, rest, SCHEMAS[command])
    except GrpoError as e:
        Console(progress=False).error(str(e))
        sys.exit(2)
    quiet_libraries()
    rest = _join_process_group(command, rest)
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
    finally:
        if _dist is not None:
            _dist.close()


def _join_process_group(command: str, overrides: list[str]) -> list[str]:
    """Under torchrun: join the process group, and make every rank use rank 0's run directory (Hydra's
    ${now:...} differs between ranks), with only rank 0 writing Hydra's .hydra/ and log."""
    global _dist
    from grpo_cli.distributed import from_environment, launched

    if not launched():
        return overrides
    if command != "train":
        print(f"error: grpo {command} runs in one process; launch it without torchrun.", file=sys.stderr)
        sys.exit(2)
    if any(o in ("-m", "--multirun") for o in overrides):
        print("error: a sweep (-m) cannot run under torchrun; launch each job with torchrun, or use a launcher such "
              "as hydra/launcher=submitit_slurm whose jobs are torchrun runs.", file=sys.stderr)
        sys.exit(2)
    _dist = from_environment()
    given = [o for o in overrides if o.split("=", 1)[0] in ("hydra.run.dir", "output_dir")]
    if not given:
        import time

        stamp = _dist.broadcast_object(time.strftime("%Y-%m-%d_%H-%M-%S") if _dist.is_main else None)
        overrides = [*overrides, f"hydra.run.dir=runs/{stamp}"]
    if not _dist.is_main:
        overrides = [*overrides, "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return overrides


if __name__ == "__main__":
    main()
