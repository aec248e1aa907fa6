"""The multi-call demo (`experiment=tool_chain`): two-hop lookups (data=links), the environment that holds
each row's table (env=links, grpo_cli/demo/tools.py: Links) and the built-in model's warm-up targets, each
against values worked out by hand or by an independent walk of the table."""

import random

import pytest

from grpo_cli.config import DataConfig
from grpo_cli.data.tasks import LETTERS, link_problems
from grpo_cli.demo.tools import Links
from helpers import grpo, metric_rows, read_jsonl, refusal
from tiny_models import tiny_chain, tiny_tools


def test_link_problems_follow_their_own_tables_are_seeded_and_hold_out_the_first_rows():
    data = link_problems(2, 300, 20, seed=1)
    assert data["train"].to_dict() == link_problems(2, 300, 20, seed=1)["train"].to_dict()
    assert data["train"].to_dict() != link_problems(2, 300, 20, seed=2)["train"].to_dict()
    assert len(data["train"]) == 300 and len(data["test"]) == 20
    assert (
        data["test"][0] == link_problems(2, 10, 20, seed=1)["test"][0]
    )  # the held-out rows do not move with num_train
    for row in data["train"].to_list() + data["test"].to_list():
        table = dict(zip(LETTERS, row["links"]))
        assert sorted(table) == list(LETTERS) and all(k != v for k, v in table.items())  # a link never stays put
        assert row["prompt"] == row["start"] + ">>="
        assert row["answer"] == table[table[row["start"]]]
    three = link_problems(3, 5, 5)["test"][0]
    walk = three["start"]
    for _ in range(3):
        walk = three["links"][ord(walk) - ord("a")]
    assert three["prompt"] == three["start"] + ">>>=" and three["answer"] == walk
    # by hand: a table whose a links to b and b links to z
    links = "bz" + "a" * 24
    env = Links()
    assert env.reset(links=links, prompt="a>>=", answer="z", start="a") is None
    assert env.follow("a") == "b" and env.follow("b") == "z" and env.follow("c") == "a"
    with pytest.raises(ValueError, match="no letter 'B'; give one of a to z"):
        env.follow("B")


def test_a_hop_count_out_of_range_is_one_sentence():
    assert "data.hops=0 must be between 1 and 8" in refusal(DataConfig(name="links", hops=0))


def test_the_warm_up_text_is_what_the_chat_template_renders_for_the_same_episode():
    """The model is warmed up on text it will read back at run time: each of its three behaviours, rendered by
    the chat template from messages, equals the warm-up's pieces (the chain: two calls, then the second result)."""
    tok = tiny_tools.build_tokenizer()
    start, links = "c", "bz" + "q" + "a" * 23  # c -> q -> a
    seen = {}
    rng = random.Random(0)
    while len(seen) < 3:
        pieces = tiny_chain.example(start, links, rng, p_chain=0.3, p_one=0.3)
        seen["".join(text for text, _ in pieces)] = pieces
    call = lambda key: {"type": "function", "function": {"name": "follow", "arguments": {"key": key}}}
    conversations = {
        "chain": [
            {"role": "assistant", "content": "", "tool_calls": [call("c")]},
            {"role": "tool", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call("q")]},
            {"role": "tool", "content": "a"},
            {"role": "assistant", "content": "a"},
        ],
        "one": [
            {"role": "assistant", "content": "", "tool_calls": [call("c")]},
            {"role": "tool", "content": "q"},
            {"role": "assistant", "content": "q"},
        ],
        "guess": [{"role": "assistant", "content": "e"}],  # two letters after c
    }
    rendered = {
        tok.apply_chat_template([{"role": "user", "content": "c>>="}, *m], tokenize=False)[len("c>>=") :]
        for m in conversations.values()
    }
    assert rendered == set(seen)
    for pieces in seen.values():  # the tool's replies are read, never trained on
        assert all(trained == (not text.startswith("<tool_response>")) for text, trained in pieces)


def lookups(messages: list[dict]) -> list[tuple[str, str]]:
    """(key the model asked for, the tool's reply) of each call in an episode's messages."""
    pairs = []
    for m, reply in zip(messages, messages[1:]):
        for call in m.get("tool_calls") or []:
            pairs.append((call["function"]["arguments"].get("key"), reply["content"]))
    return pairs


def test_the_multi_call_demo_trains_and_each_episode_reads_its_own_rows_table(tmp_path, capsys):
    """experiment=tool_chain, 2 small steps: episodes call follow() and each reply is the link of the row's own
    table; `grpo sample` hands a .jsonl row's columns to the environment too, and greedy=true gives one
    completion per prompt whatever the group size, the same under any seed."""
    out = tmp_path / "run"
    assert (
        grpo(
            "train",
            "experiment=tool_chain",
            f"output_dir={out}",
            "trainer.steps=2",
            "trainer.prompts_per_step=4",
            "sampler.group_size=8",
            "trainer.micro_batch_size=32",
            "trainer.eval_before_after=false",
            "trainer.eval_every=0",
            "trainer.progress=false",
            "trainer.log_completions_every=1",
            "trainer.threads=1",
        )
        == 0
    )
    rows = metric_rows(out, timing=False)
    assert [r["step"] for r in rows] == [1, 2] and all(r["env/tool_calls"] > 0 for r in rows)
    # A group's episodes read one table (a key gets one reply), and the right chain ends at the row's answer.
    logged = [r for r in read_jsonl(out / "completions.jsonl") if r["tool_calls"]]
    groups: dict[tuple, dict] = {}
    chains = 0
    for r in logged:
        seen = groups.setdefault((r["step"], r["prompt"], r["answer"]), {})
        pairs = lookups(r["messages"])
        for key, reply in pairs:
            if key in LETTERS:
                assert seen.setdefault(key, reply) == reply
        if len(pairs) >= 2 and pairs[0][0] == r["prompt"][0] and pairs[1][0] == pairs[0][1]:
            chains += 1
            assert pairs[1][1] == r["answer"]
    assert chains > 0

    problems = link_problems()["test"].to_list()[:3]
    (tmp_path / "p.jsonl").write_text("".join(__import__("json").dumps(p) + "\n" for p in problems))
    base = [
        "model.path=builtin:tiny-chain",
        "env=links",
        "data=links",
        "data.chat_template=true",
        "sampler.max_new_tokens=80",
        "reward.extract=full",
        f"prompts_file={tmp_path / 'p.jsonl'}",
    ]
    assert grpo("sample", *base, "sampler.group_size=8", f"output={tmp_path / 's.jsonl'}") == 0
    sampled = read_jsonl(tmp_path / "s.jsonl")
    assert len(sampled) == 24 and any(s["tool_calls"] >= 2 for s in sampled)
    for s, p in zip(sampled, [p for p in problems for _ in range(8)]):
        table = dict(zip(LETTERS, p["links"]))
        assert s["prompt"] == p["prompt"] and all(
            table[k] == reply for k, reply in lookups(s["messages"]) if k in table
        )
        assert s["reward"] == float(s["final"] == p["answer"])
    greedy = []
    for seed, group in ((0, 1), (5, 4)):
        assert (
            grpo(
                "sample",
                *base,
                "greedy=true",
                f"seed={seed}",
                f"sampler.group_size={group}",
                f"output={tmp_path / f'g{seed}.jsonl'}",
            )
            == 0
        )
        greedy.append([(g["completion"], g["reward"]) for g in read_jsonl(tmp_path / f"g{seed}.jsonl")])
    assert len(greedy[0]) == 3 and greedy[0] == greedy[1]
    capsys.readouterr()


def test_the_demo_script_prints_the_scores_before_and_after_and_both_transcripts(tmp_path):
    """make demo's script, 2 steps and 10 held-out problems: the table of held-out scores, then the base and the
    trained model's greedy episode on the first held-out problem (d>>=, answer z)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            str(root / "scripts" / "demo_tools.py"),
            "tool_chain",
            "trainer.steps=2",
            "trainer.eval_prompts=10",
            "trainer.threads=1",
            "trainer.progress=false",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert (
        "## experiment=tool_chain: 10 held-out problems" in out and "| tool calls per episode, greedy | 0.00 |" in out
    )
    assert (
        "base model, greedy, on d>>= (answer z): reward 0.0" in out
        and "trained model, greedy, on d>>= (answer z)" in out
    )
    assert "    [assistant] f" in out  # the base model's guess: two letters after d
