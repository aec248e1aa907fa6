"""`grpo evaluate`: one row of held-out scores (scoring.py) per model, over one model or a run's every
checkpoint, as a table and eval.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from grpo_cli.commands.inference import check_model_files, with_training_settings, writable_dir
from grpo_cli.config import check, freeze
from grpo_cli.errors import GrpoError
from grpo_cli.models.paths import is_adapter_dir
from grpo_cli.rewards import Judge
from grpo_cli.rollout.scoring import Draws, greedy_scores, sampled_scores
from grpo_cli.run.checkpoint import STEP_DIR, list_checkpoints, read_config


def checkpoints_to_evaluate(checkpoint, base: str) -> list[tuple[str, int | None]]:
    """(model path, step or None) for each model `checkpoint` names: null = the base model; a model or
    LoRA adapter directory, or a hub id = itself; a run directory = its checkpoints in step order, then
    final/ (the checkpoint of the last step left out: final/ holds the same weights)."""
    if checkpoint is None:
        return [(base, None)]
    # `checkpoint=100` (a directory named 100) arrives from Hydra as an int
    entries = [str(c) for c in checkpoint] if isinstance(checkpoint, (list, tuple)) else [str(checkpoint)]
    if not entries:
        raise GrpoError("checkpoint=[] names no model; pass checkpoint=PATH, a list, or null for the base model.")
    found = []
    for entry in entries:
        path = Path(entry).expanduser()
        if not path.is_dir() or (path / "config.json").exists() or is_adapter_dir(path):
            match = STEP_DIR.match(path.name)
            found.append((entry, int(match.group(1)) if match else None))
            continue
        in_run = [(str(p), int(m.group(1))) for p in list_checkpoints(path) if (m := STEP_DIR.match(p.name))]
        if (path / "final" / "config.json").exists():
            # final/ holds the weights of the run's last step: its checkpoint of that step is not scored twice
            last = (read_config(str(path / "final")) or {}).get("trainer", {}).get("steps")
            in_run = [(p, step) for p, step in in_run if step != last]
            in_run.append((str(path / "final"), last))
        if not in_run:
            raise GrpoError(
                f"checkpoint={entry} is neither a model directory (with config.json) nor a run directory with "
                "checkpoints/step-N or final/; point it at one of those."
            )
        found += in_run
    return found


def evaluation_split(cfg, tokenizer, console, tools=None):
    from grpo_cli.data.tasks import load_data

    data = load_data(cfg.data, tokenizer, log=console.warn, tools=tools)
    if cfg.split not in data:
        raise GrpoError(f"split={cfg.split!r} is not in data={cfg.data.name}; it has {list(data)}.")
    rows = data[cfg.split]
    return rows.select(range(min(cfg.limit, len(rows)))) if cfg.limit else rows


def short_names(paths: list[str]) -> list[str]:
    """Several local paths relative to the directory they share, checkpoints/ dropped: `step-2`, `final`."""
    local = [p for p in paths if Path(p).exists()]
    if len(local) < 2:
        return paths
    common = os.path.commonpath([os.path.abspath(p) for p in local])
    return [
        os.path.relpath(os.path.abspath(p), common).replace(f"checkpoints{os.sep}", "")
        if p in local and os.path.abspath(p) != common
        else p
        for p in paths
    ]


def model_scores(cfg, generator, model, split, reward_fn, judge, ks: list[int], name: str, console) -> dict:
    """One model's row: its greedy scores on `split`, and with `samples` its sampled ones (pass@k, maj@k)."""
    from grpo_cli.data.tasks import answer_column

    prompts, answers = split[cfg.data.prompt_field], split[answer_column(split.column_names, cfg.data)]
    columns = split.to_dict()
    with console.task(f"{name} greedy", len(prompts)) as advance:
        scores = greedy_scores(
            generator,
            model,
            prompts,
            answers,
            reward_fn,
            judge,
            advance=advance,
            max_new_tokens=cfg.sampler.max_new_tokens,
            batch_size=cfg.batch_size,
            columns=columns,
        )
    if cfg.samples:  # every model sees the same sampling noise
        draws = Draws(cfg.samples, cfg.sampler, tuple(ks), cfg.seed, 0, cfg.batch_size)
        with console.task(f"{name} sampled x{cfg.samples}", len(prompts)) as advance:
            scores.update(
                sampled_scores(
                    generator,
                    model,
                    prompts,
                    answers,
                    reward_fn,
                    judge,
                    draws,
                    extract=cfg.reward.extract,
                    pattern=cfg.reward.pattern,
                    columns=columns,
                    advance=advance,
                )
            )
    return scores


def write_json(path: Path, result: dict) -> None:
    """`result` as JSON at `path`; a directory that cannot be written is one sentence."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:
        raise GrpoError(
            f"Cannot write {path.name} to {path.parent} ({e.strerror}); choose another with output_dir=DIR."
        ) from None


def run_evaluate(cfg, out_dir: Path, console, overrides: Sequence[str] = ()) -> dict:
    """`grpo evaluate`: one row of scores per model on a data split, as a table and eval.json. The data,
    sampler and reward settings saved with a trained checkpoint apply unless `overrides` set them."""
    from grpo_cli.data.tasks import check_answers
    from grpo_cli.episodes import environment, generator_for
    from grpo_cli.generate.base import check_available
    from grpo_cli.models.loading import load_model, load_tokenizer, resolve_device
    from grpo_cli.models.precision import DTYPES, Precision
    from grpo_cli.models.runtime import prepare_process
    from grpo_cli.rewards import reward_with

    targets = checkpoints_to_evaluate(cfg.checkpoint, cfg.model.path)
    cfg = with_training_settings(cfg, [path for path, _ in reversed(targets)], list(overrides), console)
    check(freeze(cfg))  # again, the saved settings may have replaced groups; fixed from here on
    device = resolve_device(cfg.model.device)
    prepare_process(cfg.threads, device)
    precision = Precision(cfg.precision, device.type)
    # Every input is checked before the first model is evaluated: the models, the output directory.
    key = "checkpoint" if cfg.checkpoint is not None else "model.path"
    for path, _ in targets:
        check_model_files(path, key)
    writable_dir(out_dir, "output_dir")
    check_available(cfg.generator)  # generator=vllm without vLLM: one sentence, before any model loads
    env = environment(cfg.env)  # the tools the model was trained with (saved with the run)
    reward_fn = reward_with(cfg.reward, env, cfg.data.name)
    judge, ks = Judge(cfg.reward, reward_fn), sorted(set(cfg.k)) if cfg.samples else []
    # Prompts depend on the tokenizer only through the chat template and the length filter.
    per_model_data = cfg.data.chat_template or cfg.data.max_prompt_length is not None
    split: Any = None  # the held-out rows (a datasets.Dataset), built once unless each model renders its own
    rows: list[dict] = []
    for path, step in targets:
        console.print(f"model {len(rows) + 1}/{len(targets)}: {path}", highlight=False)
        model = load_model(path, DTYPES[cfg.precision], cfg.model.device, cfg.model.trust_remote_code, key=key)
        tokenizer = load_tokenizer(path, cfg.model.trust_remote_code, key=key)
        generator = generator_for(
            cfg.generator, cfg.data, tokenizer, env, precision=precision, device=device, seed=cfg.seed
        )
        if split is None or per_model_data:
            split = evaluation_split(cfg, tokenizer, console, env.schemas_for if env else None)
        check_answers(split.column_names, cfg.data, reward_fn, cfg.reward.correct)
        name = f"model {len(rows) + 1}/{len(targets)}"
        scores = model_scores(cfg, generator, model, split, reward_fn, judge, ks, name, console)
        rows.append({"checkpoint": path, "step": step, **scores})
        console.print(
            f"evaluated {path}: greedy accuracy {scores['accuracy']:.3f} (correct: {judge.label})", highlight=False
        )
        generator.close()  # a vLLM engine's memory goes before the next model's engine is built
        del model
    reward_fn.close()  # its worker processes, if any
    result = {
        "split": cfg.split,
        "data": cfg.data.name,
        "num_prompts": rows[0]["num_prompts"],
        "samples": cfg.samples,
        "k": ks,
        "correct": judge.label,
        "rows": rows,
    }
    write_json(out_dir / "eval.json", result)
    show_table(rows, result, out_dir, console)
    return result


def show_table(rows: list[dict], result: dict, out_dir: Path, console) -> None:
    """One row per model, narrow enough for 80 columns: maj@1 and the sampled accuracy equal pass@1,
    so only pass@1 is shown; each reward term has a column when there are several."""
    ks, terms = result["k"], [k for k in rows[0] if k.startswith("reward/")]
    columns = {
        "checkpoint": "model",
        "accuracy": "greedy",
        **({} if 1 in ks or not result["samples"] else {"sampled_accuracy": "sampled"}),
        **{f"pass@{k}": f"pass@{k}" for k in ks},
        **{f"maj@{k}": f"maj@{k}" for k in ks if k > 1},
        "reward_mean": "reward",
        **({t: t.split("/", 1)[1] for t in terms} if len(terms) > 1 else {}),
        "completion_len": "tokens",
        "truncated_frac": "trunc",
        **({"turns": "turns", "tool_use_frac": "tool use"} if "turns" in rows[0] else {}),
    }
    episodes = (
        "; turns: model turns per episode; tool use: share of episodes calling a tool" if "turns" in rows[0] else ""
    )
    shown = [{**r, "checkpoint": name} for r, name in zip(rows, short_names([r["checkpoint"] for r in rows]))]
    sampled = f", {result['samples']} samples each" if result["samples"] else ""
    console.eval_table(
        shown,
        columns,
        title=f"{result['split']} split of data={result['data']}: {result['num_prompts']} prompts{sampled}",
        caption=f"correct: {result['correct']}; greedy: greedy accuracy; pass@k: unbiased, from all samples; maj@k: "
        "majority vote of k; reward: "
        f"mean on greedy completions; tokens: their mean length; trunc: share cut off{episodes}. "
        f"{out_dir / 'eval.json'}",
    )
