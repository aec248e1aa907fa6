"""`grpo sample`: G completions per prompt from a checkpoint, scored when an answer is given."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from rich.markup import escape
from rich.table import Table

from grpo_cli.commands.inference import check_model_files, with_training_settings, writable_dir
from grpo_cli.config import check, freeze
from grpo_cli.data.prompts import USER_PROMPT, is_conversation, render_user_prompts, user_text
from grpo_cli.episodes import environment, generator_for
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import check_available, generate
from grpo_cli.models.loading import load_model, load_tokenizer, resolve_device
from grpo_cli.models.paths import is_adapter_dir
from grpo_cli.models.precision import DTYPES, Precision
from grpo_cli.models.runtime import prepare_process
from grpo_cli.rewards import PROMPT_MESSAGES, no_score_none, reward_with
from grpo_cli.run.checkpoint import list_checkpoints
from grpo_cli.samples.rollout import group_seed


def read_prompts(path: str) -> list[dict]:
    """A prompts file as rows with a "prompt" (and maybe an "answer" and more columns): a .jsonl file
    of objects, or any other text file with one prompt per non-empty line."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise GrpoError(f"prompts_file={path} does not exist.")
    lines = [(i, line) for i, line in enumerate(file.read_text().splitlines(), 1) if line.strip()]
    if file.suffix.lower() != ".jsonl":
        return [{"prompt": line} for _, line in lines]
    rows = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise GrpoError(f"Line {i} of prompts_file={path} is not JSON ({e.msg}).") from None
        if not isinstance(row, dict) or row.get("prompt") is None:
            raise GrpoError(f'Line {i} of prompts_file={path} has no "prompt" field; each line needs one.')
        rows.append({**row, "prompt": row["prompt"] if is_conversation(row["prompt"]) else str(row["prompt"])})
    return rows


def model_dir(checkpoint: str | None, base: str) -> str:
    """The model to sample: a run directory means its final/ model, else its newest checkpoint."""
    if checkpoint is None:
        return base
    path = Path(checkpoint).expanduser()
    if path.is_dir() and not (path / "config.json").exists() and not is_adapter_dir(path):
        if (path / "final" / "config.json").exists():
            return str(path / "final")
        found = list_checkpoints(path)
        if found:
            return str(found[-1])
    return checkpoint


def run_sample(cfg, console, overrides: Sequence[str] = ()) -> list[dict]:
    """`grpo sample`: prompts rendered as training renders them (the data settings saved with a trained
    checkpoint, unless `overrides` set data.*), G completions each, scored when an answer is given."""
    inputs = sample_inputs(cfg)
    path = model_dir(cfg.checkpoint, cfg.model.path)
    key = "checkpoint" if cfg.checkpoint is not None else "model.path"
    check_model_files(path, key)  # every input checked before the model loads
    cfg = with_training_settings(cfg, [path], list(overrides), console)
    check(freeze(cfg))  # again, the saved settings may have replaced groups; fixed from here on
    s = cfg.sampler
    env = environment(cfg.env)  # the tools the model was trained with: each sample is an episode
    reward = reward_with(cfg.reward, env, cfg.data.name) if any(r.get("answer") is not None for r in inputs) else None
    if cfg.output:
        writable_dir(Path(cfg.output).expanduser().parent, "output")
    prepare_process(cfg.threads, resolve_device(cfg.model.device))
    check_available(cfg.generator)  # generator=vllm without vLLM: one sentence, before any model loads
    model = load_model(path, DTYPES[cfg.precision], cfg.model.device, cfg.model.trust_remote_code, key=key)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code, key=key)
    for row, text in zip(inputs, render_user_prompts(inputs, cfg.data, tokenizer, env.schemas_for if env else None)):
        row["rendered"] = text
    device = resolve_device(cfg.model.device)
    precision = Precision(cfg.precision, device.type)
    generator = generator_for(
        cfg.generator, cfg.data, tokenizer, env, precision=precision, device=device, seed=cfg.seed
    )
    sampling = replace(s, temperature=0) if cfg.greedy else s

    rows, G = [], 1 if sampling.greedy else s.group_size
    own = sorted({k for r in inputs for k in r} - {"prompt", "rendered"})  # the answer and a .jsonl row's other columns
    for start in range(0, len(inputs), cfg.batch_size):
        batch = inputs[start : start + cfg.batch_size]
        seeds = [group_seed(cfg.seed, "sample", start + i) for i in range(len(batch))]
        columns = {
            **{k: [r.get(k) for r in batch] for k in own},  # what an environment's reset(**row) reads
            USER_PROMPT: [user_text(r["prompt"]) for r in batch],
            PROMPT_MESSAGES: [r["prompt"] if is_conversation(r["prompt"]) else None for r in batch],
        }
        roll = generate(generator, model, [r["rendered"] for r in batch], G, sampling, seeds, columns=columns)
        tokens, ids = roll.sampled_tokens().tolist(), roll.completion_ids()
        for i, source in enumerate(batch):
            group = sampled_rows(roll, i, G, user_text(source["prompt"]), tokens)
            episodes = roll.episodes[i * G : (i + 1) * G] if roll.episodes is not None else None
            if reward is not None and source.get("answer") is not None:
                score(reward, group, source, ids[i * G : (i + 1) * G], episodes)
            rows += group
    if reward is not None:
        reward.close()  # its worker processes, if any
    show(rows, G, path, console)
    if cfg.output:
        write_rows(rows, cfg.output, console)
    return rows


def sampled_rows(roll, i: int, G: int, prompt: str, tokens: list) -> list[dict]:
    """Prompt i's G rows: its completions, or with episodes each whole transcript and its messages."""
    rows = [
        {
            "prompt": prompt,
            "completion": roll.completions[i * G + j],
            "tokens": int(tokens[i * G + j]),
            "truncated": bool(roll.truncated[i * G + j]),
        }
        for j in range(G)
    ]
    for r, ep in zip(rows, roll.episodes[i * G : (i + 1) * G] if roll.episodes is not None else []):
        r.update(
            completion=ep.transcript(),
            messages=ep.logged_messages(),
            turns=ep.turns,
            tool_calls=ep.tool_calls,
            final=ep.final_text,
        )
    return rows


def sample_inputs(cfg) -> list[dict]:
    """The prompts to sample, from prompt=, prompts= and prompts_file=, each with its answer if given (one
    in the file wins over answer= on the command line)."""
    inputs = [{"prompt": p} for p in ([cfg.prompt] if cfg.prompt else []) + list(cfg.prompts)]
    if cfg.prompts_file:
        inputs += read_prompts(cfg.prompts_file)
    if not inputs:  # the config's check saw a prompts_file named, but it holds no prompt
        raise GrpoError(
            f"prompts_file={cfg.prompts_file} holds no prompt; write one per line (in a .jsonl file, "
            'objects with a "prompt" field).'
        )
    for row in inputs:
        if row.get("answer") is None and cfg.answer is not None:
            row["answer"] = cfg.answer
    return inputs


def write_rows(rows: list[dict], output: str, console) -> None:
    out = Path(output).expanduser()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    except OSError as e:
        raise GrpoError(f"Cannot write output={output} ({e.strerror}); choose another path.") from None
    console.print(f"wrote {len(rows)} completions to {out}")


def score(reward, group: list[dict], source: dict, completion_ids=None, episodes=None) -> None:
    """Each completion's reward (and each term's, for several) against the prompt's answer; the
    prompt's other file columns reach the reward as columns."""
    G, answer = len(group), str(source["answer"])
    columns = {k: [v] * G for k, v in source.items() if k != "rendered"}
    if is_conversation(source["prompt"]):  # a TRL reward reads the messages as `prompts`
        columns[PROMPT_MESSAGES] = [source["prompt"]] * G
    total, terms = reward.score(
        [source.get("rendered", source["prompt"])] * G,
        [r.get("final", r["completion"]) for r in group],
        [answer] * G,
        completion_tokens=[r["tokens"] for r in group],
        columns=columns,
        completion_ids=completion_ids,
        episodes=episodes,
    )
    for j, r in enumerate(group):
        r.update(answer=answer, reward=no_score_none(total[j]))  # None: no term scored it
        if len(terms) > 1:
            r.update({f"reward/{name}": no_score_none(values[j]) for name, values in terms.items()})


def show(rows: list[dict], group_size: int, path: str, console) -> None:
    """One section per prompt: its completions, and their rewards when it has an answer."""
    extra = list(dict.fromkeys(k for r in rows for k in r if k == "answer" or k.startswith("reward")))
    table = Table()  # the source on a line of its own: a title would be cut to the table's width
    for col in ("prompt", "completion", "tokens", *extra):
        table.add_column(
            col.split("/", 1)[-1], justify="left" if col in ("prompt", "completion", "answer") else "right"
        )
    for i, r in enumerate(rows):
        if i and i % group_size == 0:
            table.add_section()
        text = (
            r["completion"] if "messages" in r else repr(r["completion"])
        )  # an episode: its transcript, a line a turn
        cells = [
            escape(r["prompt"]) if i % group_size == 0 else "",
            escape(text),
            f"{r['tokens']}{'+' if r['truncated'] else ''}",
        ]
        cells += [f"{r[k]:.3f}" if isinstance(r.get(k), float) else escape(str(r.get(k, ""))) for k in extra]
        table.add_row(*cells)
    console.out.print(f"{group_size} samples per prompt from {escape(str(path))}", soft_wrap=True)
    console.out.print(table)
    if any(r["truncated"] for r in rows):
        console.print("tokens marked + hit sampler.max_new_tokens without an end-of-sequence token.")
