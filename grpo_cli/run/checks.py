"""Every config value checked where it is composed, before torch or transformers is imported, so a
mistake costs well under two seconds and one sentence: ranges, NaN and infinity, choices, and the
rules between keys. The typed schemas (config.py) have already ruled out unknown keys and wrong types.

Each `check_*` raises a GrpoError naming every offending key, what is allowed, and the fix.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from collections.abc import Mapping

from grpo_cli.choices import (RECOMPUTE_POINTWISE, ENV_SANDBOXES, GENERATOR_DECODES, GENERATOR_MATMULS, GENERATOR_WEIGHTS, FILE_FORMATS, ADVANTAGE_SCALES, ANSWER_EXTRACTS, BEHAVIOURS, DATA_SOURCES,
                              INFERENCE_PRECISIONS, KL_ESTIMATORS, LORA_QUANTIZE, PRECISIONS, RATIO_LEVELS,
                              REWARD_EXTRACTS, CORRECT_RULES, SANDBOXES, OBJECTIVES, SAMPLER_CORRECTIONS, SCHEDULERS, STD_KINDS, STRATEGIES)
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import GENERATORS
from grpo_cli.episodes.tool_formats import TOOL_FORMATS
from grpo_cli.run.health import HEALTH_MODES
from grpo_cli.algo.advantages import ADVANTAGES
from grpo_cli.algo.losses import AGGREGATIONS, POLICY_LOSSES
from grpo_cli.rewards import ANSWER_READERS, ENVIRONMENT_REWARDS, REWARDS, term_specs
from grpo_cli.registry import is_file_spec
from grpo_cli.run.trackers import TRACKERS

DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?|xpu(:\d+)?)$")


class Problems(list):
    """What is wrong, as clauses of one sentence."""

    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)

    def finite(self, key: str, value, low: float | None = None, high: float | None = None, *, low_open=False,
               high_open=False) -> None:
        """`key` must be a finite number in the given range."""
        if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.append(f"{key}={value} must be a finite number")
            return
        lo_ok = low is None or (value > low if low_open else value >= low)
        hi_ok = high is None or (value < high if high_open else value <= high)
        if not (lo_ok and hi_ok):
            lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
            self.append(f"{key}={value} must be {' and '.join(x for x in (lo, hi) if x)}")

    def at_least(self, key: str, value: int, low: int) -> None:
        self.need(value >= low, f"{key}={value} must be >= {low}")

    def choice(self, key: str, value, allowed) -> None:
        self.need(value in allowed, f"{key}={value!r} must be one of {', '.join(map(str, allowed))}")

    def raise_if_any(self) -> None:
        if self:
            raise GrpoError("; ".join(self) + ".")


MAX_TIMEOUT_S = 86400.0  # a deadline past a day is a typo (and past threading.TIMEOUT_MAX, a crash mid-run)

def check_generator(p: Problems, g, model) -> None:
    """generator.name, then the back-end's own rules (generators.Backend.check)."""
    p.choice("generator.name", g.name, tuple(GENERATORS))
    p.choice("generator.decode", g.decode, GENERATOR_DECODES)
    p.choice("generator.weights", g.weights, GENERATOR_WEIGHTS)
    p.choice("generator.matmul", g.matmul, GENERATOR_MATMULS)
    check = GENERATORS[g.name].check if g.name in GENERATORS else None
    if check is not None:
        check(p, g, model)


def check_worker(p: Problems, cfg) -> None:
    """The generation worker's keys (rollout_worker.py) and what it cannot do."""
    t, g, a = cfg.trainer, cfg.generator, cfg.algo
    p.at_least("trainer.max_staleness", t.max_staleness, 0)
    p.at_least("generator.threads", g.threads, 0)
    p.finite("generator.timeout_s", g.timeout_s, 0, MAX_TIMEOUT_S, low_open=True)
    p.need(t.max_staleness == 0 or a.behaviour == "current",
           f"trainer.max_staleness={t.max_staleness} lags the sampling weights behind the policy, and algo.behaviour="
           f"{a.behaviour} already samples from a policy of its own; set trainer.max_staleness=0 (generator.worker=true "
           "still samples it in a worker process) or algo.behaviour=current")
    p.need(not g.device or bool(g.worker) or t.max_staleness > 0,
           f"generator.device={g.device} places the generation worker, but there is none (generator.worker=false and "
           "trainer.max_staleness=0); set generator.worker=true, or drop generator.device")


def user_file(path: str, base: str | None) -> str:
    """Where a file the config names is: relative to `base` (reward.fn_dir, env.fn_dir), else to the
    directory grpo runs in."""
    return os.path.normpath(os.path.join(os.path.abspath(base or os.getcwd()), os.path.expanduser(path)))


def env_active(env) -> bool:
    """Whether the env group makes samples multi-turn episodes (tools or an environment named)."""
    return bool(env.tools) or bool(env.factory)


def check_env(p: Problems, env, data) -> None:
    """The env group: limits, the tool format, and that named files exist (before torch loads)."""
    p.at_least("env.max_turns", env.max_turns, 1)
    p.at_least("env.max_tokens", env.max_tokens, 1)
    p.finite("env.timeout_s", env.timeout_s, 0, MAX_TIMEOUT_S, low_open=True)
    p.at_least("env.concurrency", env.concurrency, 1)
    p.at_least("env.workers", env.workers, 0)
    p.finite("env.worker_memory_gib", env.worker_memory_gib, 0)
    p.choice("env.sandbox", env.sandbox, ENV_SANDBOXES)
    p.need(env.sandbox != "os" or env.workers >= 1 or not env_active(env),
           "env.sandbox=os confines the environment's worker processes, and env.workers is 0; set env.workers "
           "(e.g. env.workers=2), or env.sandbox=none")
    p.choice("env.tool_format", env.tool_format, ("auto", "schema", *TOOL_FORMATS))
    factories = (env.factory.items() if isinstance(env.factory, Mapping) else [("", env.factory)]) if env.factory else []
    specs = [("env.tools", str(t)) for t in env.tools] + [(f"env.factory{'.' + str(k) if k else ''}", str(v))
                                                          for k, v in factories]
    for key, spec in specs:
        p.need(":" in spec or "." in spec, f"{key}={spec} names no function or class; write it as mod:name or file.py:name")
        if is_file_spec(spec):
            where = user_file(spec.partition(":")[0], env.fn_dir)
            p.need(os.path.isfile(where), f"{key}={spec}: there is no file {where}; give the path to your file (relative "
                                          "to the directory grpo runs in)")
    p.need(not env.tools or data.chat_template, "env.tools needs the chat template to show tools and render their "
                                                "results; set data.chat_template=true")


def check_model(p: Problems, m) -> None:
    p.need(bool(str(m.path).strip()), "model.path is empty; give the model with model.path=HUB_ID_OR_DIRECTORY "
                                      "(model=instruct needs it)")
    p.choice("model.recompute_pointwise", str(m.recompute_pointwise).lower(), RECOMPUTE_POINTWISE)
    p.need(bool(DEVICE.match(str(m.device))), f"model.device={m.device!r} must be auto, cpu, cuda or cuda:N")
    lora = m.lora
    p.at_least("model.lora.r", lora.r, 0)
    if lora.r:
        p.finite("model.lora.alpha", lora.alpha, 0, low_open=True)
        p.finite("model.lora.dropout", lora.dropout, 0, 1, high_open=True)
        targets = lora.target_modules
        p.need(targets == "all-linear" or (isinstance(targets, (list, tuple)) and targets and
                                           all(isinstance(t, str) and t for t in targets)),
               f"model.lora.target_modules={targets!r} must be a list of layer names or all-linear")
    if lora.quantize is not None:
        p.choice("model.lora.quantize", lora.quantize, LORA_QUANTIZE)
        p.need(lora.r > 0, "model.lora.quantize=4bit quantizes the frozen base of a LoRA run; set model.lora.r too")


def check_sampler(p: Problems, s, *, sampling: bool = True) -> None:
    p.at_least("sampler.max_new_tokens", s.max_new_tokens, 1)
    if sampling:
        p.finite("sampler.temperature", s.temperature, 0, low_open=True)
    p.finite("sampler.top_p", s.top_p, 0, 1, low_open=True)
    p.at_least("sampler.top_k", s.top_k, 0)


def check_reward(p: Problems, r) -> None:
    p.choice("reward.name", r.name, (*ENVIRONMENT_REWARDS, *REWARDS, "combo"))
    p.choice("reward.extract", r.extract, REWARD_EXTRACTS)
    p.choice("reward.correct", r.correct, CORRECT_RULES)
    if r.correct_threshold is not None:
        p.finite("reward.correct_threshold", r.correct_threshold)
    if r.extract == "regex":
        try:
            groups = re.compile(r.pattern or "").groups
            p.need(bool(r.pattern), "reward.extract=regex needs reward.pattern, a regex with one capture group such as "
                                    "'answer: (\\d+)'")
            p.need(not r.pattern or groups >= 1, f"reward.pattern={r.pattern} has no capture group; put the answer part "
                                                 "in parentheses, e.g. 'answer: (\\d+)'")
        except re.error as e:
            p.append(f"reward.pattern {r.pattern!r} does not compile ({e}); fix the regex")
    if r.name == "combo":
        p.need(bool(r.terms), "reward=combo needs reward.terms, the rewards to add up (e.g. [exact_match,format])")
        for term in r.terms:
            p.choice("reward.terms", term, REWARDS)
        p.need(len(set(r.terms)) == len(r.terms), f"reward.terms={list(r.terms)} names a reward twice (several python "
               "rewards are one python term with a list: reward.fn=[a.py:f,b.py:g])")
    else:
        p.need(not r.terms, "reward.terms is only read by reward=combo")
    fns = r.fn if isinstance(r.fn, (list, tuple)) else None
    if fns is not None:
        p.need(bool(fns) and all(isinstance(f, str) and f for f in fns),
               f"reward.fn={list(fns)} must list functions such as [my_rewards.py:fmt,mypkg.rewards:acc]")
    specs = term_specs(r)
    files = {spec.partition(":")[0] for _, kind, spec in specs if kind == "python" and spec and is_file_spec(spec)}
    for file in sorted(files):  # a reward file that is not there: refused before torch is imported
        where = user_file(file, r.fn_dir)
        p.need(os.path.isfile(where), f"reward.fn names {file}, but there is no file {where}; give the path to your "
                                      "rewards file (relative to the directory grpo runs in)")
    if fns is not None or r.name == "combo":
        labels = [label for label, _, _ in specs]
        p.need(not r.weights or not labels or len(r.weights) == len(labels),
               f"reward.weights has {len(r.weights)} values for the {len(labels)} reward terms {labels}; give one weight "
               "per term")
    else:
        p.need(not r.weights, "reward.weights is only read by reward=combo or a list of functions in reward.fn")
    for i, w in enumerate(r.weights):
        p.finite(f"reward.weights[{i}]", w)
    p.need(not r.weights or any(w != 0 for w in r.weights if isinstance(w, (int, float))),
           f"reward.weights={list(r.weights)} are all zero, so every completion would score 0 and nothing would be "
           "learned; give at least one term a non-zero weight")
    check_reward_terms(p, r, set(r.terms) | {r.name})
    p.at_least("reward.workers", r.workers, 0)
    p.finite("reward.timeout_s", r.timeout_s, 0, MAX_TIMEOUT_S, low_open=True)
    p.finite("reward.max_failed_fraction", r.max_failed_fraction, 0, 1)
    p.finite("reward.worker_memory_gib", r.worker_memory_gib, 0)


def check_reward_terms(p: Problems, r, terms: set[str]) -> None:
    """The keys each reward term in use reads."""
    if "length" in terms:
        p.at_least("reward.max_length", r.max_length, 1)
        p.need(0 <= r.overlong_buffer < r.max_length,
               f"reward.overlong_buffer={r.overlong_buffer} must be >= 0 and below reward.max_length={r.max_length}")
    if "format" in terms:
        try:
            re.compile(r.format_pattern, re.DOTALL)
        except re.error as e:
            p.append(f"reward.format_pattern {r.format_pattern!r} does not compile ({e}); fix the regex")
    if "model" in terms:
        p.need(bool(r.model_path), "reward=model needs reward.model_path, a one-label sequence classifier")
        p.at_least("reward.model_batch_size", r.model_batch_size, 1)
        p.need(bool(DEVICE.match(str(r.model_device))), f"reward.model_device={r.model_device!r} must be auto, cpu, cuda or cuda:N")
    if "python" in terms:
        p.need(bool(r.fn), "reward=python needs reward.fn, your function such as my_rewards.py:score or mypkg.rewards:score")
    if "code" in terms:
        p.need(bool(r.tests_field), "reward=code needs reward.tests_field, the dataset column holding each row's tests")
        p.finite("reward.code_cpu_s", r.code_cpu_s, 0, 600, low_open=True)
        p.at_least("reward.code_memory_mib", r.code_memory_mib, 32)
        p.at_least("reward.code_output_kib", r.code_output_kib, 1)
        p.at_least("reward.code_processes", r.code_processes, 1)
        p.choice("reward.sandbox", r.sandbox, SANDBOXES)


def check_data(p: Problems, d) -> None:
    p.choice("data.name", d.name, DATA_SOURCES)
    if d.name == "arithmetic":
        p.at_least("data.max_operand", d.max_operand, 1)
        p.need(0 < d.num_test < (d.max_operand + 1) ** 2,
               f"data.num_test={d.num_test} must be between 1 and {(d.max_operand + 1) ** 2 - 1} for "
               f"data.max_operand={d.max_operand}")
    if d.name == "none":
        p.at_least("data.num_train", d.num_train, 1)
        p.at_least("data.num_test", d.num_test, 1)
    if d.name == "links":
        p.need(1 <= d.hops <= 8, f"data.hops={d.hops} must be between 1 and 8 (links to follow per problem)")
        p.at_least("data.num_train", d.num_train, 1)
        p.at_least("data.num_test", d.num_test, 1)
    if d.name == "long_addition":
        p.at_least("data.digits", d.digits, 1)
        p.at_least("data.num_train", d.num_train, 1)
        p.at_least("data.num_test", d.num_test, 1)
        signs = str(d.signs)
        p.need(1 <= len(signs) <= 5 and set(signs) <= {"+", "-"}, f"data.signs={signs!r} must be 1 to 5 of + and - "
                                                                   "(the signs between the operands, e.g. \"+-\" for a+b-c)")
        distinct = 10 ** ((len(signs) + 1) * max(d.digits, 0)) // 2
        p.need(d.num_train + d.num_test <= distinct, f"data.num_train + data.num_test = {d.num_train + d.num_test} must be "
                                                     f"at most {distinct}, half the distinct problems of data.digits={d.digits}"
                                                     + (f" and data.signs={signs!r}" if signs != "+" else ""))
    if d.name == "code":
        p.need(0 < d.num_test < 62, f"data.num_test={d.num_test} must be between 1 and 61, of the 62 problems of data=code")
    if d.name == "files":
        p.need(bool(d.train_file), "data=files needs data.train_file=PATH (a .jsonl, .json, .csv or .parquet file)")
        for key in ("train_file", "test_file"):  # as rollout/data.read_file says it, before torch loads
            path = getattr(d, key, None)
            if path and Path(path).suffix.lower() not in FILE_FORMATS:
                p.append(f"data.{key}={path} is not a .jsonl, .json, .csv or .parquet file")
    if d.name == "hub":
        p.need(bool(d.hub_name), "data=hub needs data.hub_name, a dataset name such as openai/gsm8k")
    p.finite("data.test_size", d.test_size, 0, low_open=True)
    if d.answer_extract is not None:
        p.choice("data.answer_extract", d.answer_extract, ANSWER_EXTRACTS)
    if d.max_prompt_length is not None:
        p.at_least("data.max_prompt_length", d.max_prompt_length, 1)
    if d.template is not None:
        try:
            fields = [f for _, f, _, _ in __import__("string").Formatter().parse(d.template) if f is not None]
            p.need(all(fields), f"data.template {d.template!r} has an empty {{}}: name a column, as in {{question}}")
        except ValueError as e:
            p.append(f"data.template {d.template!r} is not a format string ({e}): write columns as {{name}}, braces as {{{{ }}}}")
    p.need(d.system_prompt is None or d.chat_template,
           "data.system_prompt is only used with data.chat_template=true; set it, or put the text in data.template")
    p.need(bool(d.prompt_field) and bool(d.answer_field), "data.prompt_field and data.answer_field must name columns")


def check_loss(p: Problems, a) -> None:
    """algo.loss and its settings (losses.py), the dual-clip bound and the entropy bonus."""
    p.choice("algo.loss", a.loss, tuple(POLICY_LOSSES))
    spec = POLICY_LOSSES.get(a.loss)
    for key, value in dict(a.loss_args or {}).items():
        if spec is not None and key not in spec.defaults:
            known = ", ".join(spec.defaults) or "none"
            p.append(f"algo.loss_args.{key} is not a setting of algo.loss={a.loss} (its settings: {known})")
        else:
            p.finite(f"algo.loss_args.{key}", value, 0, low_open=True)
    if a.clip_ratio_c is not None:
        p.need(a.loss == "clip", f"algo.clip_ratio_c (dual-clip) bounds the clipped surrogate; it is not used by "
                                 f"algo.loss={a.loss}: set algo.clip_ratio_c=null or algo.loss=clip")
        p.finite("algo.clip_ratio_c", a.clip_ratio_c, 1, low_open=True)
    p.finite("algo.entropy_coef", a.entropy_coef, 0)


def check_train(cfg) -> None:
    """`grpo train`'s config, every group."""
    p = Problems()
    check_model(p, cfg.model)
    check_sampler(p, cfg.sampler)
    p.need(cfg.sampler.group_size >= 2,
           f"sampler.group_size must be at least 2 (got {cfg.sampler.group_size}): a group of one has no relative advantage")
    check_reward(p, cfg.reward)
    check_data(p, cfg.data)
    check_env(p, cfg.env, cfg.data)
    p.need(cfg.reward.name != "none" or bool(cfg.env.factory), "reward=none leaves the scoring to an environment, and "
           "there is none; set env.factory to an environment with get_reward() (or a step environment), or name a reward")
    if cfg.data.name == "none":
        p.need(bool(cfg.env.factory), "data=none has no prompts of its own: an environment's reset() writes each one; set "
                                      "env.factory to such an environment (or give data)")
        reading = sorted({kind for _, kind, _ in term_specs(cfg.reward) if kind in ANSWER_READERS})
        p.need(cfg.reward.name == "auto" or not reading, f"data=none has no answers for reward {', '.join(reading)} to "
               "compare with; use reward=auto (the environment's get_reward()) or a reward that reads no answer")
    check_optimizer(p, cfg.optimizer)
    check_algo(p, cfg)
    check_generator(p, cfg.generator, cfg.model)
    t = cfg.trainer
    p.need(cfg.generator.weights != "bf16" or t.precision in ("auto", "fp32"),
           f"generator.weights=bf16 samples in bf16, which trainer.precision={t.precision} already does; drop one")
    if cfg.objective is not None:
        p.choice("objective", cfg.objective, OBJECTIVES)
        p.need(not cfg.objective.endswith("accuracy_after") or t.eval_before_after,
               f"objective={cfg.objective} is measured by the held-out evaluation at the end; set "
               "trainer.eval_before_after=true or choose objective=reward_last20")
    p.at_least("trainer.steps", t.steps, 0)
    for name in t.trackers:
        p.choice("trainer.trackers", name, TRACKERS)
    for key, low in (("prompts_per_step", 1), ("micro_batch_size", 1), ("max_tokens_per_micro_batch", 0),
                     ("memory_gib", 0), ("seed", 0), ("log_every", 1), ("save_every", 1), ("keep_last", 0),
                     ("eval_every", 0), ("log_completions_every", 0), ("log_completions_groups", 0),
                     ("zero_variance_warn_steps", 1), ("threads", 0), ("nonfinite_patience", 1)):
        p.at_least(f"trainer.{key}", getattr(t, key), low)
    p.choice("trainer.health", t.health, HEALTH_MODES)
    p.choice("trainer.eval_before_at", t.eval_before_at, ("start", "end"))
    p.choice("trainer.strategy", t.strategy, STRATEGIES)
    check_worker(p, cfg)
    if t.eval_before_after or t.eval_every:  # the sentence names how to have no evaluation, which 0 seems to ask
        p.need(t.eval_prompts >= 1, f"trainer.eval_prompts={t.eval_prompts} must be >= 1 (for no held-out evaluation: "
               "trainer.eval_before_after=false trainer.eval_every=0)")
    p.need(t.precision in PRECISIONS,
           f"trainer.precision={t.precision!r} must be one of {', '.join(PRECISIONS)} (fp16 training is not offered: "
           "bf16-mixed keeps float32 master weights without a loss scaler; auto picks it where bf16 is fast)")
    p.raise_if_any()


def check_optimizer(p: Problems, o) -> None:
    p.choice("optimizer.name", o.name, ("adamw",))
    p.finite("optimizer.lr", o.lr, 0, low_open=True)
    betas_ok = isinstance(o.betas, (list, tuple)) and len(o.betas) == 2 and all(
        isinstance(b, (int, float)) and math.isfinite(b) and 0 <= b < 1 for b in o.betas)
    p.need(betas_ok, f"optimizer.betas={list(o.betas)} must be two numbers in [0, 1), such as [0.9, 0.99]")
    p.finite("optimizer.weight_decay", o.weight_decay, 0)
    p.finite("optimizer.eps", o.eps, 0, low_open=True)
    p.choice("optimizer.scheduler", o.scheduler, SCHEDULERS)
    p.need(o.scheduler != "polynomial" or not o.lr <= 1e-7, f"optimizer.scheduler=polynomial decays the rate to 1e-07, "
           f"and optimizer.lr={o.lr:g} is not above it; raise optimizer.lr or choose another scheduler")
    p.at_least("optimizer.warmup_steps", o.warmup_steps, 0)
    p.finite("optimizer.max_grad_norm", o.max_grad_norm, 0)


def check_algo(p: Problems, cfg) -> None:
    a = cfg.algo
    p.finite("algo.clip_eps", a.clip_eps, 0, 1, low_open=True, high_open=True)
    if a.clip_eps_high is not None:
        p.finite("algo.clip_eps_high", a.clip_eps_high, 0, low_open=True)
    p.finite("algo.beta", a.beta, 0)
    p.finite("algo.eps", a.eps, 0)
    p.at_least("algo.num_iterations", a.num_iterations, 1)
    check_loss(p, a)
    for key, value, allowed in (("algo.aggregation", a.aggregation, tuple(AGGREGATIONS)), ("algo.ratio_level", a.ratio_level, RATIO_LEVELS),
                                ("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS), ("algo.scale", a.scale, ADVANTAGE_SCALES),
                                ("algo.std", a.std, STD_KINDS), ("algo.behaviour", a.behaviour, BEHAVIOURS),
                                ("algo.advantage", a.advantage, tuple(ADVANTAGES))):
        p.choice(key, value, allowed)
    p.need(a.behaviour != "lagged" or a.behaviour_refresh >= 1,
           "algo.behaviour=lagged needs algo.behaviour_refresh >= 1 (steps between copies)")
    p.need(not a.behaviour_path or a.behaviour == "frozen", "algo.behaviour_path is only used with algo.behaviour=frozen")
    p.choice("algo.sampler_correction", a.sampler_correction, SAMPLER_CORRECTIONS)
    p.finite("algo.sampler_correction_cap", a.sampler_correction_cap, 1)
    p.at_least("algo.ref_refresh", a.ref_refresh, 0)
    p.at_least("algo.behaviour_refresh", a.behaviour_refresh, 0)
    p.at_least("algo.max_refill_rounds", a.max_refill_rounds, 0)
    p.need(not (cfg.model.lora.r and a.ref_refresh),
           "algo.ref_refresh copies the policy into a second model, which a LoRA run does not keep (its reference is "
           "the base with the adapter off); set algo.ref_refresh=0 or train without model.lora")
    p.need(not (a.std == "sample" and a.scale != "none" and cfg.sampler.group_size < 2),
           "algo.std=sample needs sampler.group_size >= 2")


def check_inference(p: Problems, cfg) -> None:
    check_model(p, cfg.model)
    check_generator(p, cfg.generator, cfg.model)
    p.choice("precision", cfg.precision, INFERENCE_PRECISIONS)
    p.at_least("threads", cfg.threads, 0)
    p.at_least("batch_size", cfg.batch_size, 1)
    p.at_least("seed", cfg.seed, 0)
    check_reward(p, cfg.reward)
    check_env(p, cfg.env, cfg.data)


def check_evaluate(cfg) -> list[int]:
    """`grpo evaluate`'s config; returns the sorted k values (none with samples=0: greedy only)."""
    p = Problems()
    check_inference(p, cfg)
    check_sampler(p, cfg.sampler, sampling=cfg.samples > 0)
    check_data(p, cfg.data)
    p.at_least("samples", cfg.samples, 0)
    p.need(cfg.limit is None or cfg.limit >= 1, f"limit={cfg.limit} must be >= 1 (or null for every prompt)")
    p.need(bool(str(cfg.split).strip()), "split is empty; name a split of the data group, such as test")
    ks = sorted(set(cfg.k)) if cfg.samples else []
    p.need(not ks or 1 <= ks[0] <= ks[-1] <= cfg.samples,
           f"k={ks} asks for pass@k and maj@k from samples={cfg.samples} completions per prompt; each k must be between "
           f"1 and samples: raise samples to {max(ks or [1])} or drop the larger k (samples=0 scores greedy completions only)")
    p.raise_if_any()
    return ks


def check_sample(cfg) -> None:
    """`grpo sample`'s config."""
    p = Problems()
    check_inference(p, cfg)
    check_sampler(p, cfg.sampler)
    p.at_least("sampler.group_size", cfg.sampler.group_size, 1)
    check_data(p, cfg.data)
    p.need(bool(cfg.prompt or cfg.prompts or cfg.prompts_file),
           'no prompt given; pass prompt="...", prompts=[...] or prompts_file=FILE')
    p.raise_if_any()
