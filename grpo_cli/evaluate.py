"""Held-out scoring of a model: greedy accuracy and mean reward per term, sampled accuracy, pass@k
and maj@k, completion length and truncation; `grpo evaluate` runs it over one model or a run's
every checkpoint, one row each."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import torch

from grpo_cli.checkpoint import STEP_DIR, list_checkpoints
from grpo_cli.choices import INFERENCE_PRECISIONS
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import Judge, score_batch
from grpo_cli.generation import Sampling, group_seed
from grpo_cli.lora import is_adapter_dir
from grpo_cli.rewards.exact_match import answer_extractor, normalise


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are right (Chen et al. 2021, eq. 1):
    1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i) so nothing overflows."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a right answer
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority(answers: list[str | None]) -> str | None:
    """The most common answer (None, no answer found, does not vote); a tie goes to the one seen first."""
    votes = Counter(a for a in answers if a is not None)
    return votes.most_common(1)[0][0] if votes else None


def maj_at_k(answers: list[str | None], right, k: int) -> float:
    """Majority-vote accuracy over k samples: the fraction of the len(answers) // k disjoint blocks of
    k answers (in sampling order) whose majority answer is right; `right` is the target answer, or the
    set of answers judged correct."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= {len(answers)} answers, got k={k}")
    right = right if isinstance(right, (set, frozenset)) else {right}
    blocks = [answers[s : s + k] for s in range(0, len(answers) - k + 1, k)]
    return sum(majority(b) in right for b in blocks) / len(blocks)


def _score(reward_fn, prompts, roll, answers, columns, tokens: list[int]):
    return score_batch(reward_fn, prompts, roll.completions, answers, completion_tokens=tokens, columns=columns,
                       completion_ids=roll.completion_ids())


@torch.no_grad()
def greedy_scores(generator, model, prompts, answers, reward_fn, judge: Judge, *, max_new_tokens: int,
                  batch_size: int = 256, columns: dict | None = None, advance=None) -> dict:
    """Greedy completions for every prompt, scored by the reward (which also sees `columns`, the
    dataset's columns by name, when given; each term's mean is `reward/<term>`); `accuracy` is the share
    the judge calls correct (rewards.Judge: by default, reward at its maximum)."""
    rewards, terms, correct, lengths, truncated = [], {}, [], [], []
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        roll = generator.generate(model, p, 1, Sampling(max_new_tokens, greedy=True))
        tokens = roll.completion_mask.sum(1).tolist()
        total, per_term = _score(reward_fn, p, roll, a,
                                 {k: list(v[start : start + batch_size]) for k, v in (columns or {}).items()}, tokens)
        rewards += total
        for name, values in per_term.items():
            terms.setdefault(name, []).extend(values)
        correct += judge(total, roll.completions, a)
        lengths += tokens
        truncated += roll.truncated.tolist()
        if advance:
            advance(len(p))
    n = max(len(prompts), 1)
    return {
        "accuracy": sum(correct) / n,
        "reward_mean": sum(rewards) / n,
        **{f"reward/{name}": sum(values) / n for name, values in terms.items()},
        "completion_len": sum(lengths) / n,
        "truncated_frac": sum(truncated) / n,
        "num_prompts": len(prompts),
    }


def vote_key(completion: str, target: str, answer_of) -> str:
    """What maj@k votes on: the answer as the reward's extraction reads it, else the stripped text."""
    got = answer_of(completion, target)
    return got if got is not None else completion.strip()


@torch.no_grad()
def sampled_scores(generator, model, prompts, answers, reward_fn, judge: Judge, *, samples: int, ks: list[int],
                   sampler, batch_size: int = 64, extract: str = "last_number", pattern: str | None = None,
                   seed: int = 0, offset: int = 0, columns: dict | None = None, advance=None) -> dict:
    """`samples` completions per prompt drawn with the sampler's settings, each scored by the reward and
    judged: the share correct, pass@k, and maj@k (the most common answer, read as `reward.extract`
    reads it, is right when the completions giving it are judged correct). Prompt i's noise is seeded
    by (seed, offset + i), so every model, and every split of the prompts over ranks, sees the same draws."""
    answer_of = answer_extractor(extract, pattern)
    counts, votes = [], []  # correct completions per prompt; its (vote keys, keys judged correct)
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        sampling = Sampling(sampler.max_new_tokens, sampler.temperature, sampler.top_p, sampler.top_k)
        seeds = [group_seed(seed, "evaluate", offset + start + i) for i in range(len(p))]
        roll = generator.generate(model, p, samples, sampling, seeds)
        per = lambda values: [v for v in values for _ in range(samples)]  # noqa: E731
        total, _ = _score(reward_fn, per(p), roll, per(a),
                          {k: per(v[start : start + batch_size]) for k, v in (columns or {}).items()},
                          roll.completion_mask.sum(1).tolist())
        correct = judge(total, roll.completions, per(a))
        for i, target in enumerate(a):
            block = range(i * samples, (i + 1) * samples)
            keys = [vote_key(roll.completions[j], normalise(str(target)), answer_of) for j in block]
            counts.append(sum(correct[j] for j in block))
            votes.append((keys, {k for k, j in zip(keys, block) if correct[j]}))
        if advance:
            advance(len(p))
    n = max(len(prompts), 1)
    return {
        "sampled_accuracy": sum(counts) / (n * samples),
        **{f"pass@{k}": sum(pass_at_k(samples, c, k) for c in counts) / n for k in ks},
        **{f"maj@{k}": sum(maj_at_k(keys, right, k) for keys, right in votes) / n for k in ks},
    }


def held_out_scores(generator, model, rows, reward_fn, cfg, dist=None) -> dict:
    """The trainer's held-out row: greedy accuracy and reward, and the accuracy of 4 completions per
    prompt sampled as in training (seeded per prompt by the run seed, so every evaluation draws the
    same noise). Under data parallelism each rank scores a slice of `rows`; the means are combined,
    weighted by each slice's prompts."""
    from grpo_cli.distributed import SINGLE

    dist = dist or SINGLE
    per = -(-len(rows) // dist.world_size)
    first = min(dist.rank * per, len(rows))
    part = rows.select(range(first, min(first + per, len(rows))))
    prompts, answers = part[cfg.data.prompt_field], part[cfg.data.answer_field]
    scores = {}
    with dist.full_model(model) as m:  # every rank enters: under FSDP it gathers the parameters
        if len(part):
            judge, columns = Judge(cfg.reward, reward_fn), part.to_dict()
            scores = greedy_scores(generator, m, prompts, answers, reward_fn, judge,
                                   max_new_tokens=cfg.sampler.max_new_tokens, columns=columns)
            scores.update(sampled_scores(generator, m, prompts, answers, reward_fn, judge, samples=4, ks=[],
                                         sampler=cfg.sampler, extract=cfg.reward.extract, pattern=cfg.reward.pattern,
                                         seed=cfg.trainer.seed, offset=first, columns=columns))
    parts = [(n, s) for n, s in dist.gather_objects((len(part), scores)) if n]
    total = sum(n for n, _ in parts)
    combined = {k: sum(n * s[k] for n, s in parts) / total for k in parts[0][1] if k != "num_prompts"}
    return {**combined, "num_prompts": total}


def checkpoints_to_evaluate(checkpoint, base: str) -> list[tuple[str, int | None]]:
    """(model path, step or None) for each model `checkpoint` names: null = the base model; a model or
    LoRA adapter directory, or a hub id = itself; a run directory = its checkpoints in step order, then
    final/."""
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
        in_run = [(str(p), int(STEP_DIR.match(p.name).group(1))) for p in list_checkpoints(path)]
        if (path / "final" / "config.json").exists():
            in_run.append((str(path / "final"), None))
        if not in_run:
            raise GrpoError(
                f"checkpoint={entry} is neither a model directory (with config.json) nor a run directory with "
                "checkpoints/step-N or final/; point it at one of those."
            )
        found += in_run
    return found


TRAINING_GROUPS = ("data", "sampler", "reward")  # how a model was prompted, sampled and judged


def with_training_settings(cfg, paths: list[str], overrides: list[str], console):
    """`cfg` with the data, sampler and reward groups saved with the first of `paths` that has a
    config.yaml (a checkpoint or final/ of a grpo run), for each group the command line did not set:
    a trained model is evaluated and sampled the way it was trained (chat template, system prompt,
    template, completion length, reward) unless the user says otherwise."""
    from omegaconf import OmegaConf

    from grpo_cli.checkpoint import read_config
    from grpo_cli.config import GROUP_SCHEMAS

    saved, source = None, None
    for path in paths:
        saved = read_config(path) if Path(path).is_dir() else None
        if saved:
            source = path
            break
    if not saved:
        return cfg
    mine = {o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] for o in overrides}
    taken = [g for g in TRAINING_GROUPS if g not in mine and isinstance(saved.get(g), dict)]
    for group in taken:
        merged = OmegaConf.merge(OmegaConf.structured(GROUP_SCHEMAS[group]), saved[group])
        setattr(cfg, group, OmegaConf.to_object(merged))
    if taken:
        console.print(f"using the {', '.join(taken)} settings saved with {source} (set any {taken[0]}.* key, or "
                      f"{taken[0]}=..., to use your own)", highlight=False)
    return cfg


def check_evaluate_config(cfg) -> list[int]:
    """The k values, sorted (none with samples=0: greedy only); values the schema's types cannot rule
    out are refused before any work."""
    ks = sorted(set(cfg.k)) if cfg.samples else []
    if cfg.samples < 0 or cfg.batch_size < 1 or (cfg.limit is not None and cfg.limit < 1):
        raise GrpoError("samples must be >= 0, batch_size >= 1 and limit >= 1 (or null).")
    if ks and not 1 <= ks[0] <= ks[-1] <= cfg.samples:
        raise GrpoError(
            f"k={ks} asks for pass@k and maj@k from samples={cfg.samples} completions per prompt; each k must be "
            f"between 1 and samples: raise samples to {max(ks[-1], 1)} or drop the larger k (samples=0 scores "
            "greedy completions only)."
        )
    if cfg.precision not in INFERENCE_PRECISIONS:
        raise GrpoError(f"precision={cfg.precision!r} must be one of {', '.join(INFERENCE_PRECISIONS)}.")
    if cfg.samples and cfg.sampler.temperature <= 0:
        raise GrpoError("sampler.temperature must be positive to sample; use samples=0 for greedy scores only.")
    return ks


def check_model_files(path: str, key: str) -> None:
    """A model path that exists (or is a hub id) and whose local files are whole, or one sentence naming `key`."""
    from grpo_cli.models import damaged_files, resolve_path

    location = resolve_path(path, key)
    why = damaged_files(location) if Path(location).is_dir() else None
    if why:
        raise GrpoError(f"{key}={path} cannot be loaded: {why}; point {key} to another model or checkpoint.")


def writable_dir(directory: Path, key: str) -> None:
    """`directory` exists (made if need be) and takes a file, or one sentence naming `key`."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        probe = Path(directory) / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise GrpoError(f"Cannot write to {directory} ({e.strerror or e}); choose another with {key}=DIR.") from None


def evaluation_split(cfg, tokenizer, console):
    from grpo_cli.data import load_data

    data = load_data(cfg.data, tokenizer, log=console.warn)
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
    return [os.path.relpath(os.path.abspath(p), common).replace(f"checkpoints{os.sep}", "")
            if p in local and os.path.abspath(p) != common else p for p in paths]


def run_evaluate(cfg, out_dir: Path, console, overrides: list[str] = ()) -> dict:
    """`grpo evaluate`: one row of scores per model on a data split, as a table and eval.json. The data,
    sampler and reward settings saved with a trained checkpoint apply unless `overrides` set them."""
    from grpo_cli.generation import check_available, make_generator
    from grpo_cli.models import load_model, load_tokenizer, resolve_device
    from grpo_cli.precision import DTYPES, Precision
    from grpo_cli.rewards import build_reward
    from grpo_cli.runtime import prepare_process

    targets = checkpoints_to_evaluate(cfg.checkpoint, cfg.model.path)
    cfg = with_training_settings(cfg, [path for path, _ in reversed(targets)], list(overrides), console)
    ks = check_evaluate_config(cfg)
    prepare_process(cfg.threads, resolve_device(cfg.model.device))
    precision = Precision(cfg.precision, resolve_device(cfg.model.device).type)
    # Every input is checked before the first model is evaluated: the models, the output directory.
    key = "checkpoint" if cfg.checkpoint is not None else "model.path"
    for path, _ in targets:
        check_model_files(path, key)
    writable_dir(out_dir, "output_dir")
    check_available(cfg.generator)  # generator=vllm without vLLM: one sentence, before any model loads
    reward_fn = build_reward(cfg.reward)
    judge = Judge(cfg.reward, reward_fn)
    # Prompts depend on the tokenizer only through the chat template and the length filter.
    per_model_data = cfg.data.chat_template or cfg.data.max_prompt_length is not None
    split, rows = None, []
    for path, step in targets:
        console.print(f"model {len(rows) + 1}/{len(targets)}: {path}", highlight=False)
        model = load_model(path, DTYPES[cfg.precision], cfg.model.device, cfg.model.trust_remote_code, key=key)
        tokenizer = load_tokenizer(path, cfg.model.trust_remote_code, key=key)
        generator = make_generator(cfg.generator, tokenizer, chat_template=cfg.data.chat_template, precision=precision,
                                   device=resolve_device(cfg.model.device), seed=cfg.seed)
        if split is None or per_model_data:
            split = evaluation_split(cfg, tokenizer, console)
        prompts, answers = split[cfg.data.prompt_field], split[cfg.data.answer_field]
        columns, name = split.to_dict(), f"model {len(rows) + 1}/{len(targets)}"
        with console.task(f"{name} greedy", len(prompts)) as advance:
            scores = greedy_scores(generator, model, prompts, answers, reward_fn, judge, advance=advance,
                                   max_new_tokens=cfg.sampler.max_new_tokens, batch_size=cfg.batch_size, columns=columns)
        if cfg.samples:  # every model sees the same sampling noise
            with console.task(f"{name} sampled x{cfg.samples}", len(prompts)) as advance:
                scores.update(sampled_scores(generator, model, prompts, answers, reward_fn, judge, samples=cfg.samples,
                                             ks=ks, sampler=cfg.sampler, batch_size=cfg.batch_size,
                                             extract=cfg.reward.extract, pattern=cfg.reward.pattern, seed=cfg.seed,
                                             columns=columns, advance=advance))
        rows.append({"checkpoint": path, "step": step, **scores})
        console.print(f"evaluated {path}: greedy accuracy {scores['accuracy']:.3f} (correct: {judge.label})", highlight=False)
        generator.close()  # a vLLM engine's memory goes before the next model's engine is built
        del model
    result = {"split": cfg.split, "data": cfg.data.name, "num_prompts": rows[0]["num_prompts"],
              "samples": cfg.samples, "k": ks, "correct": judge.label, "rows": rows}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:
        raise GrpoError(f"Cannot write eval.json to {out_dir} ({e.strerror}); choose another with output_dir=DIR.") from None
    show_table(rows, result, out_dir, console)
    return result


def show_table(rows: list[dict], result: dict, out_dir: Path, console) -> None:
    """One row per model, narrow enough for 80 columns: maj@1 and the sampled accuracy equal pass@1,
    so only pass@1 is shown; each reward term has a column when there are several."""
    ks, terms = result["k"], [k for k in rows[0] if k.startswith("reward/")]
    columns = {"checkpoint": "model", "accuracy": "greedy",
               **({} if 1 in ks or not result["samples"] else {"sampled_accuracy": "sampled"}),
               **{f"pass@{k}": f"pass@{k}" for k in ks}, **{f"maj@{k}": f"maj@{k}" for k in ks if k > 1},
               "reward_mean": "reward", **({t: t.split("/", 1)[1] for t in terms} if len(terms) > 1 else {}),
               "completion_len": "tokens", "truncated_frac": "trunc"}
    shown = [{**r, "checkpoint": name} for r, name in zip(rows, short_names([r["checkpoint"] for r in rows]))]
    sampled = f", {result['samples']} samples each" if result["samples"] else ""
    console.eval_table(
        shown, columns, title=f"{result['split']} split of data={result['data']}: {result['num_prompts']} prompts{sampled}",
        caption=f"correct: {result['correct']}; greedy: greedy accuracy; pass@k: unbiased, from all samples; maj@k: majority vote of k; reward: "
                f"mean on greedy completions; tokens: their mean length; trunc: share cut off. {out_dir / 'eval.json'}",
    )
