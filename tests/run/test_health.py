"""Health checks (grpo_cli/run/health.py): each rule fires on rows made to break it and stays quiet just
short of its threshold; runs built to break (completions cut at one token, a constant reward, a reward
that leaks memory) fire their rule, in metrics.jsonl and the summary, and `trainer.health=stop` saves a
checkpoint and stops with one sentence. The full default run fires none (slow lane)."""

import json
from types import SimpleNamespace

import pytest

from grpo_cli.config import SamplerConfig
from grpo_cli.run import health
from grpo_cli.run.health import Health
from helpers import grpo_process, read_jsonl

CFG = SimpleNamespace(
    sampler=SamplerConfig(max_new_tokens=6),
    trainer=SimpleNamespace(zero_variance_warn_steps=5),
    algo=SimpleNamespace(sampler_correction="none"),
)
HEALTHY = dict(
    truncated_frac=0.0,
    zero_var_frac=0.2,
    reward_std=0.4,
    reward_mean=0.5,
    reward_none_frac=0.0,
    kl=0.02,
    kl_behaviour=0.0,
    entropy=0.4,
    accuracy=0.5,
    memory_gib=1.0,
)
RUN = [
    "trainer.prompts_per_step=4",
    "sampler.group_size=4",
    "trainer.progress=false",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
    "trainer.log_completions_every=0",
    "data.max_operand=9",
    "data.num_test=6",
]


def fired(rows: list[dict]) -> list[str]:
    warned = []
    check = Health(CFG, warned.append)
    for step, row in enumerate(rows, 1):
        check.check(step, {**HEALTHY, **row})
    assert len(warned) == len(check.fired)  # one line per rule, once
    return check.fired


@pytest.mark.parametrize(
    "rule, rows, quiet",
    [
        ("truncation", [dict(truncated_frac=0.6)] * 3, [dict(truncated_frac=0.6)] * 2 + [dict(truncated_frac=0.5)]),
        ("zero_variance", [dict(zero_var_frac=1.0)] * 5, [dict(zero_var_frac=1.0)] * 4 + [dict(zero_var_frac=0.97)]),
        (
            "reward_missing",
            [dict(reward_none_frac=0.75)] * 2,
            [dict(reward_none_frac=0.75), dict(reward_none_frac=0.5)],
        ),
        ("sampler_mismatch", [{"sampler/logp_diff": 0.2}], [{"sampler/logp_diff": 0.09}]),
        ("kl_explode", [dict(kl=2.5)], [dict(kl=1.9)]),
        (
            "entropy_collapse",
            [dict(entropy=0.005, accuracy=0.2)] * 3,
            [dict(entropy=0.005, accuracy=0.9)] * 3,
        ),  # sure of itself and right: it has learned, not collapsed
        (
            "entropy_explode",
            [dict(entropy=0.4)] + [dict(entropy=2.5)] * 3,
            [dict(entropy=0.4)] + [dict(entropy=2.3)] * 3,
        ),
        (
            "memory_growth",
            [dict(memory_gib=1.0)] * 5 + [dict(memory_gib=1.0 + 0.01 * i) for i in range(9)],
            [dict(memory_gib=1.0)] * 5 + [dict(memory_gib=1.0 + 0.01 * i) for i in range(8)],
        ),
        (
            "prefix_breaks",
            [{"multiturn/prefix_break_rate": 0.3}] * 2,
            [{"multiturn/prefix_break_rate": 0.3}, {"multiturn/prefix_break_rate": 0.25}],
        ),
    ],
)
def test_a_rule_fires_past_its_threshold_and_not_short_of_it(rule, rows, quiet):
    assert fired(rows) == [rule] or (rule == "zero_variance" and "zero_variance" in fired(rows))
    assert rule not in fired(quiet)


def test_a_constant_reward_fires_both_reward_rules():
    assert set(fired([dict(reward_std=0.0, zero_var_frac=1.0)] * 5)) == {"zero_variance", "reward_constant"}


def test_under_stop_the_sentence_names_the_rule_the_step_and_the_knob():
    check = Health(CFG, print, "stop")
    sentences = [check.check(step, {**HEALTHY, "truncated_frac": 1.0}) for step in (1, 2, 3)]
    assert sentences[:2] == [None, None]
    assert (
        sentences[2].startswith("Health check 'truncation' at step 3: 100% of completions hit sampler.max_new_tokens=6")
        and "raise sampler.max_new_tokens" in sentences[2]
    )


def test_every_sentence_is_filled_in():
    rows = [
        {
            **HEALTHY,
            "truncated_frac": 1.0,
            "zero_var_frac": 1.0,
            "reward_std": 0.0,
            "reward_none_frac": 0.9,
            "sampler/logp_diff": 0.5,
            "kl": 3.0,
            "entropy": 0.001,
            "accuracy": 0.1,
            "memory_gib": 1.0 + 0.1 * i,
            "multiturn/prefix_break_rate": 0.5,
        }
        for i in range(14)
    ]
    for rule in health.rules(CFG):
        sentence = rule.sentence(rows)
        assert "{" not in sentence and "}" not in sentence, (rule.name, sentence)


def test_the_mismatch_sentence_does_not_ask_for_the_correction_already_on():
    def sentence(correction: str, row: dict) -> str:
        cfg = SimpleNamespace(**{**vars(CFG), "algo": SimpleNamespace(sampler_correction=correction)})
        return next(r for r in health.rules(cfg) if r.name == "sampler_mismatch").sentence([{**HEALTHY, **row}])

    without = sentence("none", {"sampler/logp_diff": 0.131})
    with_tis = sentence("tis", {"sampler/logp_diff": 0.131, "sampler/capped_frac": 0.0112})
    assert "by 0.131 nats a token" in without and "set algo.sampler_correction=tis" in without
    assert "set algo.sampler_correction" not in with_tis
    assert "algo.sampler_correction=tis weighs them (1.1% of tokens at its cap)" in with_tis
    assert "to remove the gap, sample in the training precision (generator=hf: generator.weights=full)" in with_tis


def test_a_truncation_s_gap_asks_for_the_correction_and_is_quiet_once_it_is_on():
    """Under top-p the gap is the kept mass by design (docs/math.md, "Truncated sampling"): the sentence names
    top-p and the correction, not the sampler's precision; with the correction on, the rule does not fire."""

    def rule(correction: str):
        truncating = {"sampler": SamplerConfig(max_new_tokens=6, top_p=0.9)}
        cfg = SimpleNamespace(**{**vars(CFG), **truncating, "algo": SimpleNamespace(sampler_correction=correction)})
        return next(r for r in health.rules(cfg) if r.name == "sampler_mismatch")

    rows = [{**HEALTHY, "sampler/logp_diff": 0.2}]
    without = rule("none")
    assert without.holds(rows)
    assert "sampler.top_p/top_k draw from the kept set only" in without.sentence(rows)
    assert "set algo.sampler_correction=tis" in without.sentence(rows)
    assert not rule("tis").holds(rows)


def test_off_checks_nothing():
    check = Health(CFG, print, "off")
    row = {**HEALTHY, "truncated_frac": 1.0}
    assert [check.check(s, row) for s in range(5)] == [None] * 5 and not check.fired and "health/truncation" not in row


def summary(out: str) -> dict:
    return json.loads(out[out.index("{") :]) if "{" in out else {}


def test_completions_cut_at_one_token_stop_the_run_under_stop_with_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = grpo_process(
        "train", f"output_dir={run}", *RUN, "trainer.steps=10", "sampler.max_new_tokens=1", "trainer.health=stop"
    )
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert "Health check 'truncation' at step 3" in error and "a checkpoint was saved" in error, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run / "checkpoints" / "step-3").is_dir()
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["health/truncation"] == 1.0
    assert "health/truncation" not in rows[1]


def test_a_constant_reward_warns_once_per_rule_and_the_summary_says_which(tmp_path):
    (tmp_path / "constant.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    run = tmp_path / "run"
    proc = grpo_process(
        "train",
        f"output_dir={run}",
        *RUN,
        "trainer.steps=7",
        "reward=python",
        "reward.fn=constant.py:score",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count("health: zero_variance at step 5") == 1 and out.count("health: reward_constant at step 5") == 1
    assert "trainer.health=stop stops such a run" in out
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r]
    assert [("health/zero_variance" in r) for r in rows] == [False] * 4 + [True] * 3
    assert "health" in out and "zero_variance, reward_constant" in out  # the run summary


def test_a_reward_that_leaks_memory_fires_memory_growth(tmp_path):
    (tmp_path / "leaky.py").write_text(
        "KEPT = []\n"
        "def score(completions, **kw):\n"
        "    KEPT.append(bytearray(24 * 2**20))  # 24 MiB kept every step, and touched\n"
        "    return [float(len(c) % 2) for c in completions]\n"
    )
    run = tmp_path / "run"
    proc = grpo_process(
        "train",
        f"output_dir={run}",
        *RUN,
        "trainer.steps=16",
        "reward=python",
        "reward.fn=leaky.py:score",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "health: memory_growth at step" in proc.stdout + proc.stderr
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r]
    first = next(r["step"] for r in rows if "health/memory_growth" in r)
    assert first == health.MEMORY_WARMUP + health.MEMORY_STEPS + 1  # as soon as the window is full


@pytest.mark.slow
def test_the_default_run_fires_no_health_rule(tmp_path):
    run = tmp_path / "run"
    proc = grpo_process("train", f"output_dir={run}", "trainer.threads=1", "trainer.progress=false", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "health:" not in proc.stdout + proc.stderr
    rows = read_jsonl(run / "metrics.jsonl")
    assert not [k for r in rows for k in r if k.startswith("health/")]
    assert "no rule fired" in proc.stdout


def test_memory_that_grows_with_the_steps_tokens_is_not_called_a_leak():
    """Episodes lengthen as a model learns to call tools, and memory follows: quiet while the window's tokens pass
    the earlier high by over 10% (here 1000 -> 1160 a step); the same growth on flat tokens fires."""
    warm = [dict(memory_gib=1.0, prompt_tokens=100, completion_tokens=900)] * 5
    growing = [dict(memory_gib=1.0 + 0.01 * i, prompt_tokens=100, completion_tokens=900 + 20 * i) for i in range(9)]
    flat = [dict(memory_gib=1.0 + 0.01 * i, prompt_tokens=100, completion_tokens=900) for i in range(9)]
    assert "memory_growth" not in fired(warm + growing)
    assert fired(warm + flat) == ["memory_growth"]
