"""A tool-calling demo end to end: train it, then show what changed, from the run's own held-out scores and
one held-out episode of the base and the trained model, greedy.

    python scripts/demo_tools.py tool_chain            # two dependent calls per episode (experiment=tool_chain)
    python scripts/demo_tools.py tool_use              # one calculator call (experiment=tool_use)
    python scripts/demo_tools.py tool_chain trainer.steps=40 output_dir=/tmp/chain   # overrides go to grpo train

`make demo` runs the first (DEMO=tool_use for the second). Prints a Markdown table (held-out success and tool
calls per episode, before and after) and the two transcripts; the run is in runs/demo/<demo> (replacing the
last demo's) unless output_dir= says otherwise.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from grpo_cli.data.tasks import link_problems, long_addition_problems

# experiment -> (grpo sample's settings for the base model, as the preset sets them; its held-out rows)
DEMOS = {
    "tool_chain": (
        [
            "model.path=builtin:tiny-chain",
            "env=links",
            "data=links",
            "data.chat_template=true",
            "sampler.max_new_tokens=80",
            "reward.extract=full",
        ],
        lambda: link_problems()["test"],
    ),
    "tool_use": (
        [
            "model.path=builtin:tiny-tools",
            "env=calculator",
            "data=long_addition",
            "data.chat_template=true",
            "sampler.max_new_tokens=80",
        ],
        lambda: long_addition_problems()["test"],
    ),
}
SHOWN = (
    ("accuracy", "success, greedy"),
    ("sampled_accuracy", "success, sampled"),
    ("tool_calls", "tool calls per episode, greedy"),
    ("tool_use_frac", "episodes calling a tool, greedy"),
    ("turns", "model turns per episode, greedy"),
)


def grpo(*args: str, quiet: bool = False) -> None:
    """A grpo command; `quiet`: its output is shown only if it fails."""
    done = subprocess.run([sys.executable, "-m", "grpo_cli", *args], text=True, capture_output=quiet)
    if done.returncode != 0:
        if quiet:
            print(done.stdout + done.stderr, file=sys.stderr)
        sys.exit(done.returncode)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in DEMOS:
        sys.exit(f"usage: python scripts/demo_tools.py {{{','.join(DEMOS)}}} [grpo train overrides]")
    demo, overrides = sys.argv[1], sys.argv[2:]
    given = next((o.split("=", 1)[1] for o in overrides if o.startswith("output_dir=")), None)
    out = given or f"runs/demo/{demo}"
    base, held_out = DEMOS[demo]
    again = [] if given else ["overwrite=true"]  # the demo's own directory holds the last demo: run it afresh
    grpo(
        "train",
        f"experiment={demo}",
        f"output_dir={out}",
        *again,
        *[o for o in overrides if not o.startswith("output_dir=")],
    )

    evals = [
        r for r in map(json.loads, (Path(out) / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "eval"
    ]
    before, after = evals[0], evals[-1]
    held = OmegaConf.load(Path(out) / "config.yaml").trainer.eval_prompts
    print(f"\n## experiment={demo}: {held} held-out problems\n")
    print(f"| held-out | base | after {after['step']} steps |\n| --- | ---: | ---: |")
    for key, label in SHOWN:
        if f"eval/{key}" in before and f"eval/{key}" in after:
            print(f"| {label} | {before[f'eval/{key}']:.2f} | {after[f'eval/{key}']:.2f} |")

    row = held_out()[0]
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text(json.dumps(row) + "\n")
        for name, model in (("base", base), ("trained", [f"checkpoint={out}/final"])):
            grpo("sample", *model, f"prompts_file={prompts}", "greedy=true", f"output={tmp}/{name}.jsonl", quiet=True)
            (episode,) = map(json.loads, Path(f"{tmp}/{name}.jsonl").read_text().splitlines())
            print(
                f"\n{name} model, greedy, on {row['prompt']} (answer {row['answer']}): reward {episode.get('reward')}\n"
            )
            print("    " + episode["completion"].replace("\n", "\n    "))


if __name__ == "__main__":
    main()
