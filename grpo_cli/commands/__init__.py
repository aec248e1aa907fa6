"""The commands besides training: composing and checking configs, --help, evaluate, sample, sweeps.

`SweepSummary` is Hydra's callback (train.yaml's hydra.callbacks), instantiated by every run: it stays this
small, and loads the sweep's table (sweep.py) only at a sweep's end."""

from __future__ import annotations

from hydra.experimental.callback import Callback

SUMMARY_FILE = "summary.json"  # each job writes its row (cli.write_job_summary); the sweep's table is built from them
# Jobs that stopped on a user mistake (a GrpoError: status "failed" in their summary.json); the CLI exits 2
# after the sweep when there are any. A job that crashes with a bug writes no summary: the launcher
# re-raises its exception once the batch has run, before on_multirun_end, and the sweep ends with that trace.
failed_jobs: list[str] = []


class SweepSummary(Callback):
    """At the end of a sweep: the summary.json each job wrote in its own directory, as a table and sweep.csv
    (sweep.py), so the table is the same whatever process ran the jobs."""

    def on_multirun_start(self, config, **kwargs) -> None:
        failed_jobs.clear()

    def on_multirun_end(self, config, **kwargs) -> None:
        from grpo_cli.commands.sweep import report

        failed_jobs.extend(report(config.hydra.sweep.dir, SUMMARY_FILE))
