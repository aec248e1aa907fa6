"""The GRPO loop (docs/math.md, "The algorithm"), read top to bottom: load the policies, then per step
collect groups -> rewards -> group advantages -> log-probabilities -> mu clipped updates -> refresh ->
metrics -> checkpoint.

Under torchrun every rank runs this same function on its share of each step's prompts (whole groups,
so advantages need no communication); distributed.py does the communicating and rank 0 the writing.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from rich.markup import escape
from transformers import get_scheduler

from grpo_cli.checkpoint import (CONFIG_FILE, clean_temporaries, experiment_diff, load_sharded, load_state,
                                 resolve_resume, save_checkpoint, save_final, set_rng_state, write_config)
from grpo_cli.checks import check_train
from grpo_cli.console import Console, MetricsLog
from grpo_cli.data import USER_PROMPT, PromptOrder, load_data
from grpo_cli.distributed import SINGLE, Dist
from grpo_cli.errors import GrpoError
from grpo_cli.evaluate import held_out_scores
from grpo_cli.generation import check_available, group_seed, make_generator
from grpo_cli.models import load_tokenizer, resolve_device
from grpo_cli.policies import RunPolicies, load_policy
from grpo_cli.precision import check_pure_bf16_lr, training_precision
from grpo_cli.publish import check_push, push, write_model_card
from grpo_cli.rewards import Judge, build_reward
from grpo_cli.runtime import prepare_process
from grpo_cli.step import PromptBatch, completion_rows, grpo_step, shown_group
from grpo_cli.trackers import check_trackers, open_trackers, tracker_names
from grpo_cli.stopping import GracefulStop, Stopped

RUN_FILES = ("metrics.jsonl", "completions.jsonl", "checkpoints", "final")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_config(cfg) -> None:
    """Every value of a train config (checks.py); kept under this name for code that builds configs."""
    check_train(cfg)


def build_optimizer(model, cfg, total_steps: int):
    if cfg.name != "adamw":
        raise GrpoError(f"Unknown optimizer.name={cfg.name!r}; choose optimizer=adamw.")
    params = [p for p in model.parameters() if p.requires_grad]
    # Fused: one pass over each tensor instead of one per arithmetic op (1.37 s -> 0.31 s for 494M
    # float32 parameters on this CPU); torch has it for CPU and CUDA floating-point tensors, FSDP's too.
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps,
                            fused=fused or None)
    try:
        sched = get_scheduler(cfg.scheduler, opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=max(total_steps, 1))
    except ValueError as e:
        raise GrpoError(f"optimizer.scheduler={cfg.scheduler!r} is not a transformers schedule ({e}).") from None
    return opt, sched


def resolve_strategy(strategy: str, dist: Dist) -> str:
    if strategy == "auto":
        return "ddp" if dist.world_size > 1 else "single"
    if strategy == "single" and dist.world_size > 1:
        raise GrpoError(f"trainer.strategy=single, but torchrun started {dist.world_size} processes; set "
                        "trainer.strategy=ddp (or fsdp), or launch one process.")
    if strategy != "single" and dist.world_size == 1 and dist is SINGLE:
        raise GrpoError(f"trainer.strategy={strategy} needs a process group: launch with torchrun "
                        "(torchrun --nproc-per-node N -m grpo_cli train ...), or set trainer.strategy=auto.")
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


def resume_point(cfg, run_dir: Path, console: Console) -> tuple[Path | None, dict, Path]:
    """(checkpoint to resume from, its state, the run directory): a new run's directory must not hold
    another run already, unless overwrite=true clears it."""
    resume_from = resolve_resume(cfg.resume, run_dir, warn=console.warn)
    if resume_from is None:
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        if held and str(cfg.resume).strip().lower() != "auto" and not cfg.overwrite:
            raise GrpoError(f"{run_dir} already holds a run ({', '.join(held)}); continue it with resume=auto, or "
                            "start over there with overwrite=true (which deletes it), or choose another output_dir.")
        return None, {}, run_dir
    state = load_state(resume_from)
    if not cfg.output_dir and str(cfg.resume).lower() != "auto":
        run_dir = resume_from.parent.parent  # resume=PATH continues in that checkpoint's run
    if state["step"] > cfg.trainer.steps:
        raise GrpoError(f"{resume_from} is at step {state['step']}, past trainer.steps={cfg.trainer.steps}; raise "
                        "trainer.steps to continue the run (its final/ is left as it is).")
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
    return (f"model.path={cfg.model.path} runs with the built-in tiny model's settings "
            f"({', '.join(f'{k}={v:g}' for k, v in kept.items())}), which suit a 3 MB model, not a real one; "
            "start from a preset (experiment=instruct, experiment=qwen_gsm8k) or set those keys.")


def train(cfg, run_dir: Path, console: Console, dist: Dist = SINGLE, command: str | None = None) -> dict:
    """`grpo train`: the whole run, on this rank. Returns the summary printed at the end."""
    check_config(cfg)
    check_push(cfg)  # before any work: a push that cannot happen is refused now, not after training
    note = builtin_settings_note(cfg)
    if note:
        console.print(f"[bold]note:[/] {escape(note)}", highlight=False)
    t, world = cfg.trainer, dist.world_size
    strategy = resolve_strategy(t.strategy, dist)
    if t.prompts_per_step % world:
        raise GrpoError(f"trainer.prompts_per_step={t.prompts_per_step} must divide by the {world} processes, so each "
                        f"rank samples whole groups; use a multiple of {world}.")
    device = resolve_device(cfg.model.device)
    prepare_process(t.threads, device, dist.local_world_size)
    trackers = tracker_names(t)
    check_trackers(trackers)  # a missing extra is reported before anything is loaded
    check_available(cfg.generator)  # generator=vllm without vLLM: one sentence, before any model loads
    run_dir = Path(run_dir)
    open_run_dir(run_dir, dist)
    set_seed(t.seed)
    resume_from, state, run_dir = resume_point(cfg, run_dir, console)
    if dist.is_main:
        if cfg.overwrite and resume_from is None:
            for name in RUN_FILES:
                shutil.rmtree(run_dir / name, ignore_errors=True) if (run_dir / name).is_dir() else (run_dir / name).unlink(missing_ok=True)
        for left in clean_temporaries(run_dir):
            console.warn(f"removed {left}, left by a save that was interrupted")
        write_config(run_dir / CONFIG_FILE, asdict(cfg))  # written once the run is accepted, never over another
        write_config(run_dir / "overrides.yaml", {"command": command or "", "world_size": world})
    dist.barrier()

    # The policies (docs/math.md, "Policies") and everything that feeds them.
    precision = training_precision(t.precision, device)
    tokenizer = (load_tokenizer(str(resume_from), cfg.model.trust_remote_code, key="resume") if resume_from
                 else load_tokenizer(cfg.model.path, cfg.model.trust_remote_code))
    sharded = strategy == "fsdp"
    if state and sharded and not state.get("sharded"):
        raise GrpoError(f"{resume_from} was written without FSDP, so its optimizer state cannot be sharded; resume it "
                        "with trainer.strategy=ddp (or in one process), or start a new FSDP run with resume=false.")
    policy = load_policy(cfg, precision, None if sharded else resume_from)  # FSDP restores its shards below
    if precision.name == "bf16" and not cfg.model.lora.r:  # a LoRA adapter is float32 whatever the base
        check_pure_bf16_lr(policy, cfg.optimizer.lr)
    policies = RunPolicies(cfg, precision, policy)
    policy = dist.wrap(policy, strategy)
    if sharded and policies.reference is not None:
        dist.wrap(policies.reference, strategy)  # the reference is sharded too
    policies.policy = policy
    policies.load_state_dict(state)  # a refreshed reference or lagged behaviour is not on disk
    roles = policies.roles()
    generator = make_generator(cfg.generator, tokenizer, chat_template=cfg.data.chat_template, precision=precision,
                               device=device, world_size=world, seed=t.seed)
    data = load_data(cfg.data, tokenizer, log=console.warn)
    train_rows, test_rows = data["train"], data["test"]
    user_text = (dict(zip(train_rows[cfg.data.prompt_field], train_rows[USER_PROMPT]))
                 if USER_PROMPT in train_rows.column_names else {})  # chat-rendered prompt -> what the user wrote
    reward_fn = build_reward(cfg.reward)
    optimizer, scheduler = build_optimizer(policy, cfg.optimizer, t.steps)
    if state:
        if state.get("sharded"):  # torch.distributed.checkpoint reshards to this world size (one process too)
            load_sharded(resume_from, policy, optimizer)
        else:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state.get("world_size", 1) != world:
            console.print(f"resuming a {state.get('world_size', 1)}-process run on {world}: the prompts and sampled "
                          "completions of each step are the same (they depend on the seed and step alone)")
    order = PromptOrder(len(train_rows), t.prompts_per_step, t.seed)
    resumed_at = state.get("step", 0)
    writes = dist.is_main  # rank 0 writes every file of the run
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=writes,
                         trackers=open_trackers(trackers, run_dir, asdict(cfg), t.tracker_project,
                                                resumed_at if state else None) if writes else None)
    samples_log = MetricsLog(run_dir / "completions.jsonl", enabled=writes)
    for log in (metrics, samples_log):
        log.truncate(resumed_at)  # rows past the checkpoint are redone, not duplicated
    held_out = test_rows.select(range(min(t.eval_prompts, len(test_rows))))

    def evaluate_held_out() -> dict:
        """Greedy and sampled (4 per prompt) held-out scores, the prompts split over ranks."""
        return held_out_scores(generator, policy, held_out, reward_fn, cfg, dist)

    def eval_row(step: int, scores: dict) -> dict:
        """Held-out scores as a metrics row: `eval/` keys and no `reward_mean`, so readers of the
        training rows (which filter on it) pass them by."""
        return {"step": step, "kind": "eval", **{f"eval/{k}": v for k, v in scores.items() if k != "num_prompts"}}

    correct_rule = Judge(cfg.reward, reward_fn).label  # every printed accuracy says what "correct" means

    def evaluate_now(step: int) -> None:
        scores = evaluate_held_out()
        metrics.write(eval_row(step, scores))
        console.print(f"step {step} held-out: greedy accuracy {scores['accuracy']:.3f}, "
                      f"sampled {scores['sampled_accuracy']:.3f}, reward {scores['reward_mean']:.3f} (correct: {correct_rule})")

    before = state.get("held_out_before") or (evaluate_held_out() if t.eval_before_after else None)
    if before:
        console.print(
            f"held-out accuracy on {len(held_out)} prompts before training: "
            f"greedy {before['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} (correct: {correct_rule})"
        )
        if t.eval_every and not state:
            metrics.write(eval_row(0, before))  # where the held-out curve starts

    n_local = t.prompts_per_step // world  # this rank's prompts: whole groups, positions rank*n_local...

    def my_share(indices: list[int], step: int, round_: int = 0) -> PromptBatch:
        """This rank's slice of a step's prompts; each group's noise is seeded by (run seed, step, its
        position in the whole batch, round), so the groups are the same on 1 or N processes."""
        first = dist.rank * n_local
        rows = train_rows[indices[first : first + n_local]]
        seeds = [group_seed(t.seed, step, first + i, round_) for i in range(n_local)]
        return PromptBatch(rows[cfg.data.prompt_field], rows[cfg.data.answer_field], seeds, rows)

    def refill(step: int):
        """More prompts for dynamic sampling, drawn by a generator seeded by (seed, step, round)."""
        def draw(round_: int) -> PromptBatch:
            g = torch.Generator().manual_seed(t.seed * 1_000_003 + step * 1_009 + round_)
            return my_share(torch.randint(len(train_rows), (t.prompts_per_step,), generator=g).tolist(), step, round_)
        return draw

    def save(step: int) -> None:
        # No data position: PromptOrder makes the prompts of every step a function of (seed, step).
        save_checkpoint(run_dir, step, policy, tokenizer, {
            "optimizer": {} if sharded else optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "config": asdict(cfg), "held_out_before": before, **policies.state_dict(),
        }, keep_last=t.keep_last, dist=dist, optimizer=optimizer)

    if state:
        rngs = state.get("rng_per_rank") or [state["rng"]]
        set_rng_state(rngs[dist.rank] if len(rngs) == world else state["rng"])  # last: after every setup step
    first_step = state.get("step", 0) + 1
    zero_var_streak, skipped_streak, start = 0, 0, time.perf_counter()

    def announce(signum: int) -> None:
        console.warn(f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                     "(press Ctrl-C again to stop at once)")

    with console.training(t.steps, start=first_step - 1, log_every=t.log_every), GracefulStop(announce) as stop:
        for step in range(first_step, t.steps + 1):
            policy.train()
            row, roll = grpo_step(roles, generator, optimizer, my_share(order.indices(step - 1), step), reward_fn, cfg,
                                  precision=precision, refill=refill(step), dist=dist)
            skipped_streak = skipped_streak + 1 if row["skipped"] else 0
            if row["skipped"]:
                console.warn(f"step {step}: the loss or gradient was not finite, so this update was skipped "
                             f"({skipped_streak} in a row; the run stops at trainer.nonfinite_patience={t.nonfinite_patience}).")
            if skipped_streak >= t.nonfinite_patience:
                raise GrpoError(
                    f"{skipped_streak} updates in a row had a non-finite loss or gradient (step {step}), so training "
                    "stopped with the weights of the last finite update; lower optimizer.lr, check that the reward "
                    "is bounded, or resume from the last checkpoint with resume=auto."
                )
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            policies.refresh(step)
            row = {"step": step, **row, "lr": lr}
            if step % t.log_every == 0 or step == t.steps:
                metrics.write(row)
            console.step(row)
            if t.log_completions_every and t.log_completions_groups and step % t.log_completions_every == 0:
                sample = completion_rows(step, roll, t.log_completions_groups, user_text)
                for r in sample:
                    samples_log.write(r)
                show = shown_group(sample, roll.group_size)
                console.completions(show, f"step {step}: completions of {show[0]['prompt']!r} (answer "
                                    f"{show[0]['answer']}); {len(sample)} in completions.jsonl")
            if t.eval_every and step % t.eval_every == 0:
                evaluate_now(step)

            zero_var_streak = zero_var_streak + 1 if row["zero_var_frac"] == 1.0 else 0
            if zero_var_streak == t.zero_variance_warn_steps:
                console.warn(
                    f"every group has had zero reward variance for {zero_var_streak} steps, so the advantages "
                    "and the loss are zero and nothing learns; raise sampler.temperature or group_size, or use "
                    "an easier task or a denser reward."
                )
            signum = int(dist.all_max(stop.signum or 0))  # a signal to any rank stops every rank, together
            if step % t.save_every == 0 or step == t.steps or signum:
                save(step)
            if signum:
                raise Stopped(signum, step)

    policy.eval()
    save_final(run_dir, policy, tokenizer, dist, lora_base=cfg.model.path if cfg.model.lora.r else None,
               config=asdict(cfg))
    metrics.close()
    rows = [r for r in metrics.read() if "reward_mean" in r]  # training rows, not eval/ ones
    last = rows[-20:]
    summary = {
        "steps": t.steps,
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last20": sum(r["reward_mean"] for r in last) / len(last) if last else None,
        "seconds": time.perf_counter() - start,
        "run_dir": str(run_dir),
    }
    if before:
        after = evaluate_held_out()  # drawn like every periodic evaluation: the last one agrees
        summary.update(
            greedy_accuracy_before=before["accuracy"], greedy_accuracy_after=after["accuracy"],
            sampled_accuracy_before=before["sampled_accuracy"], sampled_accuracy_after=after["sampled_accuracy"],
            correct=correct_rule,
        )
        console.print(
            f"held-out accuracy on {len(held_out)} prompts: greedy {before['accuracy']:.3f} -> "
            f"{after['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f} "
            f"(correct: {correct_rule})"
        )
    if dist.is_main:
        card = write_model_card(run_dir / "final", cfg, summary, command or "grpo train")
        if cfg.hub.push:
            summary["pushed"] = push(card.parent, cfg, console)
    return summary
