"""A training run's life around the loop (trainer.py): `start_run` checks the config, claims the run
directory (resume policy included), loads the policies and everything that feeds them, and returns a
`Run`; `Run.save` writes a checkpoint; `finish_run` writes final/, the summary, the model card and the
hub push. Rank 0 writes every file; every rank builds the same objects.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from rich.markup import escape

from grpo_cli.config import check, freeze, reference_in_worker
from grpo_cli.config.commands import NO_RESUME
from grpo_cli.data.prompts import USER_PROMPT, encode_prompts
from grpo_cli.data.tasks import PromptOrder, answer_column, check_answers, load_data
from grpo_cli.episodes import env_notes, environment, generator_for
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import check_available
from grpo_cli.models.distributed import SINGLE, Dist, unwrap
from grpo_cli.models.loading import load_tokenizer, resolve_device
from grpo_cli.models.policies import Policies, load_policy
from grpo_cli.models.precision import Precision, check_pure_bf16_lr, training_precision
from grpo_cli.models.runtime import prepare_process
from grpo_cli.rewards import Judge, check_reward_columns, load_user_rewards, reward_with
from grpo_cli.rollout.held_out import HeldOut, HeldOutSettings
from grpo_cli.rollout.source import LocalSource, RolloutSource
from grpo_cli.run.checkpoint import (
    CONFIG_FILE,
    clean_temporaries,
    experiment_diff,
    load_state,
    write_config,
)
from grpo_cli.run.console import Console, MetricsLog
from grpo_cli.run.floors import StepFloors, cached_peaks
from grpo_cli.run.observers import AfterStep
from grpo_cli.run.plan import planned
from grpo_cli.run.publish import check_push
from grpo_cli.run.state import Run
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update.schedules import schedule

RUN_FILES = ("metrics.jsonl", "completions.jsonl", "checkpoints", "final")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_optimizer(model, cfg, total_steps: int):
    """AdamW over the trainable parameters and the schedule `optimizer.scheduler` names (update/schedules.py;
    both checked by the config's declarations)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # Fused: one pass over each tensor instead of one per arithmetic op (1.37 s -> 0.31 s for 494M
    # float32 parameters on this CPU); torch has it for CPU and CUDA floating-point tensors, FSDP's too.
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    opt = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps, fused=fused or None
    )
    sched = schedule(cfg.scheduler, opt, cfg.warmup_steps, max(total_steps, 1))
    return opt, sched


def resolve_strategy(strategy: str, dist: Dist) -> str:
    if strategy == "auto":
        return "ddp" if dist.world_size > 1 else "single"
    if strategy == "single" and dist.world_size > 1:
        raise GrpoError(
            f"trainer.strategy=single, but torchrun started {dist.world_size} processes; set "
            "trainer.strategy=ddp (or fsdp), or launch one process."
        )
    if strategy != "single" and dist.world_size == 1 and dist is SINGLE:
        raise GrpoError(
            f"trainer.strategy={strategy} needs a process group: launch with torchrun "
            "(torchrun --nproc-per-node N -m grpo_cli train ...), or set trainer.strategy=auto."
        )
    return strategy


def open_run_dir(run_dir: Path, dist: Dist) -> None:
    """The run directory exists and can be written (rank 0 checks; every rank hears the answer)."""
    problem = None
    if dist.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / ".write_test").write_text("")
            (run_dir / ".write_test").unlink()
        except OSError as e:
            problem = e.strerror or str(e)
    problem = dist.broadcast_object(problem)
    if problem:
        raise GrpoError(f"Cannot write to the run directory {run_dir} ({problem}); choose another with output_dir=DIR.")


def resume_point(cfg, run_dir: Path, console: Console, skipped: list) -> tuple[Path | None, dict, Path]:
    """(checkpoint to resume from, its state, the run directory): a new run's directory must not hold
    another run already, unless overwrite=true clears it. Checkpoints resume=auto skipped go to `skipped`."""
    resume_from = None
    if cfg.resume is not None and str(cfg.resume).strip().lower() not in NO_RESUME:  # a new run loads none of it
        from grpo_cli.run.resume import resolve_resume

        resume_from = resolve_resume(cfg.resume, run_dir, warn=console.warn, skipped=skipped)
    if resume_from is None:
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        if held and str(cfg.resume).strip().lower() != "auto" and not cfg.overwrite:
            raise GrpoError(
                f"{run_dir} already holds a run ({', '.join(held)}); continue it with resume=auto, or "
                "start over there with overwrite=true (which deletes it), or choose another output_dir."
            )
        return None, {}, run_dir
    state = load_state(resume_from)
    if not cfg.output_dir and str(cfg.resume).lower() != "auto":
        run_dir = resume_from.parent.parent  # resume=PATH continues in that checkpoint's run
    if state["step"] > cfg.trainer.steps:
        raise GrpoError(
            f"{resume_from} is at step {state['step']}, past trainer.steps={cfg.trainer.steps}; raise "
            "trainer.steps to continue the run (its final/ is left as it is)."
        )
    changed = experiment_diff(state.get("config", {}), asdict(cfg))
    if changed:
        raise GrpoError(
            f"Refusing to resume from {resume_from}: these settings differ from the run being resumed "
            f"({'; '.join(changed)}); drop those overrides, or start a new run with resume=false."
        )
    console.print(f"resuming from {resume_from} (step {state['step']})")
    return resume_from, state, run_dir


# The built-in model's settings (conf/train.yaml, sampler/default.yaml, optimizer/adamw.yaml): tuned for a
# 3 MB model that answers in a few characters. A real model left on them truncates and diverges.
BUILTIN_MODEL_SETTINGS = {"sampler.max_new_tokens": 6, "optimizer.lr": 3e-4, "trainer.micro_batch_size": 64}


def builtin_settings_note(cfg) -> str | None:
    """A start-up note when model.path leaves the built-in model but the run keeps its settings."""
    if cfg.model.path.startswith("builtin:"):
        return None
    settings = OmegaConf.structured(cfg)
    kept = {k: v for k, v in BUILTIN_MODEL_SETTINGS.items() if OmegaConf.select(settings, k) == v}
    if not kept:
        return None
    return (
        f"model.path={cfg.model.path} runs with the built-in tiny model's settings "
        f"({', '.join(f'{k}={v:g}' for k, v in kept.items())}), which suit a 3 MB model, not a real one; "
        "start from a preset (experiment=instruct, experiment=qwen_gsm8k) or set those keys."
    )


def check_run(cfg, console: Console, dist: Dist):
    """What can be refused before anything loads: the config, the user's reward and environment files, a
    hub push, the strategy for this launch; returns (the environment, the strategy)."""
    cfg.plugins = [os.path.abspath(os.path.expanduser(p)) if p.endswith(".py") or "/" in p else p for p in cfg.plugins]
    check(cfg)  # imports the plugins (by absolute path: the worker and evaluate find them from anywhere)
    if cfg.reward.fn and cfg.reward.fn_dir is None:  # saved with the run: evaluate and sample find the reward anywhere
        cfg.reward.fn_dir = os.getcwd()
    if cfg.env.active and cfg.env.fn_dir is None:  # as reward.fn_dir: tools are found from anywhere later
        cfg.env.fn_dir = os.getcwd()
    load_user_rewards(cfg.reward)  # a reward file or module that is not there: refused now, before any model loads
    env = environment(cfg.env)  # tools and environment classes too
    check_push(cfg)  # before any work: a push that cannot happen is refused now, not after training
    note = builtin_settings_note(cfg)
    if note:
        console.print(f"[bold]note:[/] {escape(note)}", highlight=False)
    t, world = cfg.trainer, dist.world_size
    strategy = resolve_strategy(t.strategy, dist)
    if t.prompts_per_step % world:
        raise GrpoError(
            f"trainer.prompts_per_step={t.prompts_per_step} must divide by the {world} processes, so each "
            f"rank samples whole groups; use a multiple of {world}."
        )
    return env, strategy


def start_run(cfg, run_dir: Path, console: Console, dist: Dist, command: str | None) -> Run:
    """Check the config, claim the run directory, load the policies and restore a checkpoint's state."""
    import transformers

    console.phase(f"loaded torch {torch.__version__} and transformers {transformers.__version__}")
    env, strategy = check_run(cfg, console, dist)
    freeze(cfg)  # the edge: every builder below reads settings that no longer change
    t = cfg.trainer
    device, worker_device, threads, trackers = prepare_machine(cfg, dist)
    open_run_dir(run_dir, dist)
    set_seed(t.seed)
    skipped: list[Path] = []  # damaged checkpoints resume=auto passed over: set aside once the run is accepted
    resume_from, state, run_dir = resume_point(cfg, run_dir, console, skipped)
    precision, why = training_precision(t.precision, device)
    if why:
        console.print(escape(why), highlight=False) if why.startswith("precision:") else console.warn(escape(why))
    cached_peaks(device, precision.frozen_dtype)  # a first run here probes the machine now, before any model loads
    tokenizer, data, plan = load_inputs(cfg, resume_from, state, precision, env, dist.world_size, device, console)
    train_rows = data["train"]
    claim_run_dir(cfg, run_dir, resume_from, console, dist, command, skipped)
    policy, policies = load_policies(cfg, precision, strategy, resume_from, state, dist)
    console.phase(loaded_line(cfg, policy, precision, resume_from))
    warn_env(cfg, env, unwrap(policy), tokenizer, train_rows[cfg.data.prompt_field], console)
    answers = (cfg.data.prompt_field, answer_column(train_rows.column_names, cfg.data))
    prompts = PromptOrder(len(train_rows), t.prompts_per_step, t.seed, dist.rank, dist.world_size, train_rows, answers)
    reward_fn = reward_with(
        cfg.reward, env, cfg.data.name
    )  # an environment that scores episodes is one more reward term
    check_answers(train_rows.column_names, cfg.data, reward_fn, cfg.reward.correct)
    optimizer, scheduler = build_optimizer(policy, cfg.optimizer, t.steps)
    metrics, samples_log = open_logs(cfg, run_dir, trackers, state, dist)
    settings = replace(StepSettings.of(cfg, Judge(cfg.reward, reward_fn)), max_tokens=plan.budget)
    run = Run(
        cfg=cfg,
        run_dir=run_dir,
        console=console,
        dist=dist,
        command=command,
        precision=precision,
        tokenizer=tokenizer,
        policy=policy,
        policies=policies,
        reward_fn=reward_fn,
        settings=settings,
        optimizer=optimizer,
        scheduler=scheduler,
        user_text=user_texts(train_rows, cfg.data.prompt_field),
        prompts=prompts,
        metrics=metrics,
        samples_log=samples_log,
        first_step=state.get("step", 0) + 1,
        saved=state.get("step", 0),
        resumed_from=resume_from,
        plan=plan,
    )
    run.source = open_source(run, env, worker_device, cfg.generator.threads or threads)
    run.after = AfterStep(run, StepFloors.of(cfg, policy, precision, dist.world_size))  # the peaks: probed, cached
    return restored(run, state, data["test"])


def prepare_machine(cfg, dist: Dist):
    """(the device, the generation worker's or None, this process's threads, the trackers), each checked before
    anything loads: a tracker's missing extra, a generator back-end that is not installed."""
    t, device = cfg.trainer, resolve_device(cfg.model.device)
    worker_device = generation_device(cfg, device, dist.local_rank)
    shared = worker_device is not None and worker_device.type == device.type == "cpu"  # the worker takes half the cores
    threads = prepare_process(t.threads, device, dist.local_world_size * (2 if shared else 1), t.deterministic)
    trackers = list(dict.fromkeys(t.trackers))
    if trackers:  # their module loads only when asked; a missing extra is reported before anything is loaded
        from grpo_cli.run.trackers import check_trackers

        check_trackers(trackers)
    check_available(cfg.generator)  # generator=vllm without vLLM: one sentence, before any model loads
    return device, worker_device, threads, trackers


def loaded_line(cfg, policy, precision: Precision, resume_from) -> str:
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    ref = ", with a frozen reference" if cfg.algo.beta else ""
    ref = ", the KL reference scored in the generation worker" if reference_in_worker(cfg) else ref
    where = resume_from or cfg.model.path
    return f"loaded the model {where}: {trained / 1e6:.2f}M trained parameters, {precision.name}{ref}"


def user_texts(rows, prompt_field: str) -> dict:
    """Each rendered prompt's user text, for the completions log (conversational data keeps it apart)."""
    return dict(zip(rows[prompt_field], rows[USER_PROMPT])) if USER_PROMPT in rows.column_names else {}


def restored(run: Run, state: dict, test_rows) -> Run:
    """`run` with a checkpoint's `state` restored (the RNG last: nothing below draws from it), the logs cut to
    the step it resumes from, and the held-out scores before training taken (or read back)."""
    cfg, t, console, resumed_at = run.cfg, run.cfg.trainer, run.console, state.get("step", 0)
    try:
        run.restore(state)
        run.source.update(run.policy, run.first_step - 1)  # the weights the run starts from
    except BaseException:
        run.source.close()
        raise
    for log in (run.metrics, run.samples_log):  # only now: a checkpoint that fails to load leaves the logs whole
        log.truncate(resumed_at)
    settings = HeldOutSettings.of(cfg.data, cfg.sampler, cfg.reward, t.seed, test_rows.column_names)
    run.held_out = HeldOut(t, settings, test_rows, run.source, run.settings.judge, run.dist, console, run.metrics)
    if t.eval_before_after and not state.get("held_out_before") and not run.held_out.deferred:
        console.phase(f"scoring {min(t.eval_prompts, len(test_rows))} held-out prompts before training")
    run.held_out_before = run.held_out.before(state.get("held_out_before"), t.eval_before_after, first_row=not state)
    console.phase(
        f"step {resumed_at + 1}: sampling {t.prompts_per_step} prompts x {cfg.sampler.group_size} completions"
    )
    return run


def generation_device(cfg, device: torch.device, local_rank: int) -> torch.device | None:
    """The generation worker's device (rollout/worker.py), or None when the run generates in-process."""
    if not (cfg.trainer.max_staleness or cfg.generator.worker):
        return None
    from grpo_cli.rollout.worker import worker_device

    return worker_device(cfg.generator, device, local_rank)


def warn_env(cfg, env, model, tokenizer, prompts: list[str], console: Console) -> None:
    """Before training with an environment: what episodes/notes.py finds worth a warning."""
    for note in env_notes(cfg.env, cfg.data, env, model, tokenizer, prompts):
        console.warn(note)


def open_logs(cfg, run_dir: Path, trackers: list[str], state: dict, dist: Dist) -> tuple[MetricsLog, MetricsLog]:
    """metrics.jsonl (with the trackers) and completions.jsonl, written by rank 0 alone; rows a resumed
    run's checkpoint does not cover are cut once it has loaded (start_run), then redone, not duplicated."""
    resumed_at, writes, opened = state.get("step", 0), dist.is_main, None
    if writes and trackers:
        from grpo_cli.run.trackers import open_trackers

        opened = open_trackers(
            trackers, run_dir, asdict(cfg), cfg.trainer.tracker_project, resumed_at if state else None
        )
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=writes, trackers=opened)
    return metrics, MetricsLog(run_dir / "completions.jsonl", enabled=writes)


def open_source(run: Run, env, worker_device, threads: int) -> RolloutSource:
    """The run's rollout source (source.py): in this process, or the whole chain in a worker process on
    `worker_device` (trainer.max_staleness > 0 or generator.worker). This process builds a generator only
    when it samples itself, or scores the held-out prompts itself (the worker samples a behaviour policy,
    not the policy)."""
    cfg, dist, t = run.cfg, run.dist, run.cfg.trainer
    local: LocalSource | None = None
    if worker_device is None or cfg.algo.behaviour != "current":
        device = resolve_device(cfg.model.device)
        generator = generator_for(
            cfg.generator,
            cfg.data,
            run.tokenizer,
            env,
            precision=run.precision,
            device=device,
            world_size=dist.world_size,
            seed=t.seed,
        )
        local = LocalSource(
            generator,
            run.policies,
            run.reward_fn,
            run.settings,
            precision=run.precision,
            dist=dist,
            prompts=run.prompts,
            warn=run.console.warn,
        )
    if local is not None and worker_device is None:
        return local
    if cfg.algo.dynamic_sampling and dist.world_size > 1:
        raise GrpoError(
            "algo.dynamic_sampling in the generation worker refills each rank's groups alone, without the "
            "quota every rank shares under torchrun; set generator.worker=false and trainer.max_staleness=0, "
            "or run one process."
        )
    run.console.phase(
        f"starting the generation worker on {worker_device} ({threads} thread{'s' * (threads != 1)}), "
        f"max_staleness={t.max_staleness}"
    )
    from grpo_cli.rollout import worker as rollout_worker
    from grpo_cli.rollout.ahead import WorkerSource

    spec = rollout_worker.WorkerSpec.of(cfg, run.settings, worker_device, threads)
    worker = rollout_worker.RolloutWorker(
        spec, run.tokenizer, run.prompts, next(run.policy.parameters()).device, cfg.generator.timeout_s
    )
    return WorkerSource(
        worker,
        run.policies,
        cfg.algo,
        max_staleness=t.max_staleness,
        first_step=run.first_step,
        last_step=t.steps,
        warn=run.console.warn,
        evaluator=local,
        prompts=run.prompts,
        reference=spec.reference,
    )


def load_inputs(cfg, resume_from, state: dict, precision: Precision, env, world: int, device, console: Console):
    """The tokenizer, the data and the memory plan (tokenizer, data splits, token budget per micro-batch):
    before any model loads, and before the run directory is claimed, so a config that cannot fit leaves
    the directory as it was."""
    tokenizer = (
        load_tokenizer(str(resume_from), cfg.model.trust_remote_code, key="resume")
        if resume_from
        else load_tokenizer(cfg.model.path, cfg.model.trust_remote_code)
    )
    data = load_data(cfg.data, tokenizer, log=console.warn, tools=env.schemas_for if env else None)
    train_rows = data["train"]
    for name, split in data.items():
        check_reward_columns(cfg.reward, split, name)
    console.phase(f"data={cfg.data.name}: {len(train_rows):,} training prompts, {len(data['test']):,} held out")
    plan = planned(
        cfg,
        encode_prompts(tokenizer, train_rows[cfg.data.prompt_field], cfg.data.chat_template),
        precision,
        world,
        state.get("max_tokens_per_micro_batch"),
        device,
    )
    console.print(escape(plan.line()), highlight=False)
    return tokenizer, data, plan


def claim_run_dir(cfg, run_dir: Path, resume_from, console: Console, dist: Dist, command: str | None, skipped=()):
    """Rank 0 empties the directory (overwrite=true), removes what an interrupted save left, moves the
    checkpoints resume skipped aside (their next save would replace them), and writes the config once the
    run is accepted, never over another run's."""
    if dist.is_main:
        if skipped:
            from grpo_cli.run.resume import set_aside

            set_aside(list(skipped))
        if cfg.overwrite and resume_from is None:
            for name in RUN_FILES:
                shutil.rmtree(run_dir / name, ignore_errors=True) if (run_dir / name).is_dir() else (
                    run_dir / name
                ).unlink(missing_ok=True)
        for left in clean_temporaries(run_dir):
            console.warn(f"removed {left}, left by a save that was interrupted")
        write_config(run_dir / CONFIG_FILE, asdict(cfg))
        write_config(run_dir / "overrides.yaml", {"command": command or "", "world_size": dist.world_size})
    dist.barrier()


def load_policies(cfg, precision: Precision, strategy: str, resume_from, state: dict, dist: Dist):
    """The policy (wrapped for DDP / FSDP) and its reference and behaviour (docs/math.md, "Policies")."""
    sharded = strategy == "fsdp"
    if state and sharded and not state.get("sharded"):
        raise GrpoError(
            f"{resume_from} was written without FSDP, so its optimizer state cannot be sharded; resume it "
            "with trainer.strategy=ddp (or in one process), or start a new FSDP run with resume=false."
        )
    policy = load_policy(cfg.model, precision, None if sharded else resume_from)  # FSDP restores its shards below
    if precision.name == "bf16" and not cfg.model.lora.r:  # a LoRA adapter is float32 whatever the base
        check_pure_bf16_lr(policy, cfg.optimizer.lr)
    policies = Policies.load(cfg, precision, policy)
    policy = dist.wrap(policy, strategy)
    if sharded and isinstance(policies.held_reference, torch.nn.Module):  # a frozen copy, not the adapter-less base
        dist.wrap(policies.held_reference, strategy)  # the reference is sharded too
    policies.policy = policy
    return policy, policies
