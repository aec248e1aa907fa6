"""The GPU lane: on one CUDA GPU, what the CPU lanes prove, scaled to the device; a JSON of figures and a table.

    make gpu-check                                    # on a CUDA machine: every stage, about 10 minutes on an H100
    python scripts/gpu_check.py --out runs/gpu-check --only probe decode train
    python scripts/gpu_check.py --small               # CPU smoke run of the harness (tests/slow/test_gpu_check.py)
    python scripts/gpu_report.py runs/gpu-check/gpu_check.json   # then: the results as data, the page's tables

It needs no network: the 0.5B-class model is Qwen2.5-0.5B's architecture with random weights written
on the spot (scripts/compare_trl.py's), with a reward that is a fixed function of the completion's text,
so runs are repeatable; TRL, bitsandbytes and Hydra come from wheels carried beside the tree where the
machine has none (docs/gpu-check.md says how). Each stage runs in processes of its own with a time
limit; a failed stage records its output's tail and the rest go on. Stages past --deadline seconds are
recorded as not run. The JSON is rewritten after every stage, so a run cut short keeps what it found.

Stages:
  probe       GPU, driver-visible memory, torch/transformers, measured copy bandwidth and bf16 matmul TFLOP/s
  static      tests/generate/test_static_steps.py on CUDA: CUDA-graph and compiled decoding sample eager's tokens
  decode      scripts/bench_decode.py: ms per token at batch 1/16/64, eager, static and compiled, against the floor
  train       bf16-mixed full training of the 0.5B model, trainer.deterministic=true: s/step, tokens/s, peak
              memory against the planner's prediction, and how far the weights moved
  resume      the same run stopped after 2 steps and resumed to 4: the final weights equal train's, bitwise
  planner     the planner's predicted peak against torch.cuda.max_memory_allocated on more shapes
  lora        LoRA (r=16) and QLoRA (4-bit NF4 base, bitsandbytes): each trains, weights of the adapter move
  worker      the generation worker on the same GPU, weights pushed through the transport after each update
  torchrun    torchrun with NCCL, world 1 (and 2 where two GPUs exist)
  tools       the tool-use demo (experiment=tool_use, shortened) on CUDA
  agent       the agent demo (experiment=tool_agent, 2 steps): an agent's code through the local endpoint, on CUDA
  trl         scripts/compare_trl.py --device cuda: TRL 1.16 and grpo-cli on the 0.5B model, bf16, same settings
  vllm        generator=vllm colocated, if vLLM imports
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

STAGES = (
    "probe",
    "static",
    "decode",
    "train",
    "torchrun",
    "tools",
    "agent",
    "worker",
    "resume",
    "planner",
    "trl",
    "lora",
    "vllm",
)  # the order they run in: what no GPU run has reached yet comes early (docs/gpu-check.md)
REWARD = '''import zlib


def parity(prompts, completions, **kwargs):
    """1 or 0 by a checksum of the completion's text: varied within a group, the same on every run."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
'''


class Check:
    """The run's settings, its work folder and the figures found so far."""

    def __init__(self, args):
        self.args, self.small = args, args.small
        self.device = "cpu" if args.small else "cuda"
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work) if args.work else self.out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "gpu_check_rewards.py").write_text(REWARD)
        self.results: dict[str, dict] = {}
        self.output = ""  # the last command's whole output
        self.t0 = time.perf_counter()
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(self.work), os.environ.get("PYTHONPATH", "")]),
        }
        if self.small:
            self.env["OMP_NUM_THREADS"] = "1"

    def left(self) -> float:
        return self.args.deadline - (time.perf_counter() - self.t0)

    def run(self, cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
        """(exit status, the output's tail, seconds); 124 when it ran past `timeout`."""
        t0 = time.perf_counter()
        try:
            done = subprocess.run(
                cmd,
                env={**self.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=max(5.0, min(timeout, self.left())),
                cwd=ROOT,
            )
            code, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            code = 124
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        self.output = text  # all of it, for the lines a figure is read from
        return code, text[-3000:], time.perf_counter() - t0

    def model(self) -> str:
        """The 0.5B-shaped model directory (or the built-in tiny model with --small)."""
        if self.small:
            return "builtin:tiny"
        from compare_trl import qwen_dir

        return str(qwen_dir(self.work))

    def train(
        self,
        name: str,
        *overrides: str,
        steps: int = 4,
        timeout: float = 240,
        launcher: list[str] | None = None,
        env: dict | None = None,
    ) -> dict:
        """One `grpo train` of the 0.5B model (random prompts, the parity reward): its figures."""
        run_dir = self.work / name
        prompts = self.work / "prompts.jsonl"
        if not prompts.exists():
            from bench import QWEN_PAD_ID, random_prompts

            rows = [f"{i}+{i % 7}=" for i in range(64)] if self.small else random_prompts(64, 32, QWEN_PAD_ID, 0)
            prompts.write_text("".join(json.dumps({"prompt": p, "answer": ""}) + "\n" for p in rows))
        new_tokens = 8 if self.small else 128
        args = [
            f"output_dir={run_dir}",
            "overwrite=true",
            f"model.path={self.model()}",
            f"model.device={self.device}",
            "data=files",
            f"data.train_file={prompts}",
            "data.test_size=4",
            "reward=python",
            "reward.fn=gpu_check_rewards:parity",
            "trainer.prompts_per_step=8",
            "sampler.group_size=8",
            f"sampler.max_new_tokens={new_tokens}",
            "trainer.micro_batch_size=16",
            "optimizer.lr=1e-5",
            f"trainer.steps={steps}",
            "trainer.progress=false",
            "trainer.eval_before_after=false",
            "trainer.eval_every=0",
            "trainer.log_completions_every=0",
            "trainer.save_every=2",
            "algo.beta=0.04",
            "trainer.deterministic=true",
            *(["trainer.precision=bf16-mixed"] if not self.small else []),
            *overrides,
        ]
        cmd = [*(launcher or [sys.executable, "-m", "grpo_cli"]), "train", *args]
        code, tail, seconds = self.run(cmd, timeout, env)
        out = {"ok": code == 0, "exit": code, "wall_s": round(seconds, 1)}
        metrics = run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        rows = [r for r in rows if "reward_mean" in r]
        if rows:
            timed = rows[1:] or rows
            out.update(
                steps=len(rows),
                s_per_step=round(statistics.median(r["seconds"] for r in timed), 3),
                tokens_per_s=round(statistics.median(r["tokens_per_s"] for r in timed), 1),
                peak_gib=round(max(r.get("peak_memory_gib", 0) for r in rows), 3),
                phases={k: round(statistics.median(r[k] for r in timed), 3) for k in ("gen_s", "score_s", "update_s")},
                reward=[round(r["reward_mean"], 3) for r in rows],
            )
        plans = re.findall(r"memory plan: (peak ([0-9.]+) GiB.*)$", self.output, re.M)
        if plans:  # the plan before the run, then again from the first step's samples
            out["planned_gib"], out["plan"] = float(plans[0][1]), plans[0][0]
            if len(plans) > 1:
                out["planned_from_samples_gib"] = float(plans[1][1])
            if out.get("peak_gib"):
                out["planned_over_measured"] = round(out["planned_gib"] / out["peak_gib"], 3)
        warned = sorted(set(re.findall(r"^.*(?:deterministic|atomic).*$", self.output, re.M)))
        if warned:  # what trainer.deterministic could not make repeatable (torch warns and runs it)
            out["determinism_warnings"] = warned[:5]
        if code != 0:
            out["tail"] = tail
        return out


def stage_probe(c: Check) -> dict:
    import torch
    import transformers
    from bench_decode import bandwidth

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    if c.small:
        return {**out, "device": f"CPU ({torch.backends.cpu.get_cpu_capability()})", "ok": True}
    props = torch.cuda.get_device_properties(0)
    measured, rated = bandwidth("cuda")
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    tflops = 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        **out,
        "ok": True,
        "device": props.name,
        "gpus": torch.cuda.device_count(),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "sms": props.multi_processor_count,
        "nvidia_smi": smi,
        "copy_tb_s": round(measured / 1e12, 2),
        "rated_tb_s": rated and rated / 1e12,
        "bf16_matmul_tflops": round(tflops, 1),
    }


STATIC_TESTS = "tests/generate/test_static_steps.py"


def stage_static(c: Check) -> dict:
    code, tail, seconds = c.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "slow or not slow", STATIC_TESTS],
        300,
    )  # the compiled steps' tests included: torch.compile builds their kernels first
    summary = re.findall(r"(\d+) (passed|failed|skipped|error)", tail)
    return {
        "ok": code == 0,
        "wall_s": round(seconds, 1),
        **{k: int(v) for v, k in summary},
        **({"tail": tail} if code else {}),
    }


def stage_decode(c: Check) -> dict:
    path = c.out / "decode.json"
    small = ["--device", "cpu", "--shape", "small", "--batch", "1", "4", "--new-tokens", "16", "--repeats", "1"]
    code, tail, seconds = c.run(
        [sys.executable, "scripts/bench_decode.py", "--json", str(path), *(small if c.small else ["--repeats", "2"])],
        300,
    )  # 3 repeats took 100 s on an H100
    out = {"ok": code == 0, "wall_s": round(seconds, 1), "table": tail.strip().splitlines()[-5:]}
    if path.exists():
        out.update(json.loads(path.read_text()))
    if code:
        out["tail"] = tail
    return out


def stage_train(c: Check) -> dict:
    out = c.train("train")
    if out["ok"]:
        out["weights_moved"] = weight_change(Path(c.model()) if not c.small else None, c.work / "train" / "final")
    return out


def tensors(folder: Path) -> dict:
    """Every tensor of a model directory's safetensors files, by name."""
    from safetensors.torch import load_file

    found = {}
    for f in sorted(folder.glob("*.safetensors")):
        found.update(load_file(f))
    return found


def weight_change(start: Path | None, final: Path) -> float | None:
    """The largest absolute change of any weight between the model the run started from and its final/."""
    if start is None:
        return None
    a, b = tensors(start), tensors(final)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a.keys() & b.keys())


def stage_resume(c: Check) -> dict:
    first = c.train("resumed", steps=2)
    second = c.train("resumed", "resume=auto", "overwrite=false", steps=4)
    out = {"ok": first["ok"] and second["ok"], "first": first, "second": second}
    straight = c.work / "train" / "final"
    if out["ok"] and straight.exists():
        a, b = tensors(straight), tensors(c.work / "resumed" / "final")
        differ = [k for k in a if not (k in b and a[k].equal(b[k]))]
        out.update(bitwise=not differ, tensors=len(a), differing=len(differ))
        out["ok"] = not differ
    return out


def stage_planner(c: Check) -> dict:
    shapes = {
        "fp32 full": ["trainer.precision=fp32"],
        "bf16-mixed, gradient checkpointing": ["model.gradient_checkpointing=true"],
        "bf16-mixed, 256 new tokens, micro-batch 32": ["sampler.max_new_tokens=256", "trainer.micro_batch_size=32"],
    }
    out = {
        "shapes": {
            "bf16-mixed (train stage)": {
                k: c.results.get("train", {}).get(k)
                for k in ("planned_gib", "peak_gib", "planned_over_measured", "plan")
            }
        }
    }
    for name, extra in shapes.items():
        if c.small:
            extra = [e for e in extra if "precision" not in e and "max_new_tokens" not in e]
        r = c.train("planner-" + re.sub(r"\W+", "-", name), *extra, steps=2)
        out["shapes"][name] = {
            k: r.get(k)
            for k in ("ok", "planned_gib", "peak_gib", "planned_over_measured", "plan", "tail")
            if r.get(k) is not None
        }
    ratios = [
        s["planned_gib"] / s["peak_gib"] for s in out["shapes"].values() if s.get("planned_gib") and s.get("peak_gib")
    ]
    out["ok"] = len(ratios) == len(out["shapes"])
    out["within_20pct"] = bool(ratios) and all(0.8 <= r <= 1.2 for r in ratios)
    return out


def stage_lora(c: Check) -> dict:
    out = {"lora": c.train("lora", "model.lora.r=16", steps=2)}
    try:
        import bitsandbytes  # noqa: F401

        out["qlora"] = c.train("qlora", "model.lora.r=16", "model.lora.quantize=4bit", steps=2)
    except ImportError as e:
        out["qlora"] = {"ok": None, "not_run": f"bitsandbytes does not import ({e})"}
    out["ok"] = out["lora"]["ok"] and out["qlora"]["ok"] is not False
    return out


def stage_worker(c: Check) -> dict:
    r = c.train("worker", "generator.worker=true", "trainer.max_staleness=1", steps=3)
    return r


def stage_torchrun(c: Check) -> dict:
    import socket

    import torch

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    out = {}
    worlds = [1] + ([2] if not c.small and torch.cuda.device_count() >= 2 else [])
    for world in worlds:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(world),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "grpo_cli",
        ]
        out[f"world_{world}"] = c.train(f"torchrun-{world}", "trainer.strategy=ddp", steps=2, launcher=launcher)
    out["ok"] = all(r["ok"] for r in out.values())
    return out


def stage_tools(c: Check) -> dict:
    return demo(c, "tools", "tool_use", 4 if c.small else 20)


def stage_agent(c: Check) -> dict:
    """The agent demo (demo/agent.py) through the OpenAI-compatible endpoint, its decode on the GPU."""
    return demo(c, "agent", "tool_agent", 2)


def demo(c: Check, name: str, experiment: str, steps: int) -> dict:
    """`grpo train experiment=...` shortened, on the device: its rewards, s/step and held-out accuracy."""
    run_dir = c.work / name
    code, tail, seconds = c.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "train",
            f"experiment={experiment}",
            f"output_dir={run_dir}",
            "overwrite=true",
            f"model.device={c.device}",
            f"trainer.steps={steps}",
            "trainer.progress=false",
            "trainer.eval_prompts=50",
            "trainer.eval_every=0",
        ],
        300,
    )
    rows = (
        [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
    train_rows = [r for r in rows if "reward_mean" in r]
    out = {"ok": code == 0, "wall_s": round(seconds, 1), "steps": len(train_rows)}
    if train_rows:
        out.update(
            reward_first=train_rows[0]["reward_mean"],
            reward_last5=statistics.mean(r["reward_mean"] for r in train_rows[-5:]),
            s_per_step=round(statistics.median(r["seconds"] for r in train_rows), 3),
        )
    accuracy = re.search(r"held-out accuracy[^\n]*greedy ([0-9.]+) -> ([0-9.]+), sampled ([0-9.]+) -> ([0-9.]+)", tail)
    if accuracy:
        out["greedy_before_after"] = [float(accuracy.group(1)), float(accuracy.group(2))]
        out["sampled_before_after"] = [float(accuracy.group(3)), float(accuracy.group(4))]
    out["summary"] = tail.strip().splitlines()[-6:]
    if code:
        out["tail"] = tail
    return out


def stage_trl(c: Check) -> dict:
    try:
        import trl
    except ImportError as e:
        return {"ok": None, "not_run": f"TRL does not import ({e})"}
    if c.small:
        return {"ok": None, "not_run": "--small: the TRL comparison needs a GPU's time"}
    code, tail, seconds = c.run(
        [
            sys.executable,
            "scripts/compare_trl.py",
            "--device",
            "cuda",
            "--task",
            "qwen-shape",
            "--precision",
            "bf16",
            "--qwen-steps",
            "4",
            "--qwen-warmup",
            "1",
            "--work",
            str(c.work),
            "--json",
            str(c.out / "trl.json"),
        ],
        300,
    )  # the 0.5B model the other stages wrote is reused
    found = json.loads((c.out / "trl.json").read_text())["rows"] if (c.out / "trl.json").exists() else []
    return {
        "ok": code == 0,
        "trl": trl.__version__,
        "wall_s": round(seconds, 1),
        "rows": found,
        "table": tail.strip().splitlines()[-14:],
        **({"tail": tail} if code else {}),
    }


def stage_vllm(c: Check) -> dict:
    try:
        import vllm
    except ImportError as e:
        return {
            "ok": None,
            "not_run": f"vLLM does not import here ({e}); its CUDA wheel is over the carry limit of a "
            "machine with no network",
        }
    r = c.train(
        "vllm", "generator=vllm", "generator.gpu_memory_utilization=0.3", "algo.sampler_correction=tis", steps=3
    )
    return {**r, "vllm": vllm.__version__}


def table(results: dict) -> str:
    lines = ["| stage | ok | figures |", "| --- | --- | --- |"]
    for name, r in results.items():
        ok = {True: "yes", False: "FAILED", None: "not run"}[r.get("ok")]
        figures = {k: v for k, v in r.items() if k not in ("ok", "tail", "table", "summary", "rows")}
        text = json.dumps(figures, default=str)
        lines.append(f"| {name} | {ok} | {text[:400]}{'...' if len(text) > 400 else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gpu-check")
    ap.add_argument("--work", help="where models and runs go (default OUT/work)")
    ap.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument(
        "--deadline", type=float, default=540.0, help="seconds for the whole check; later stages are not run"
    )
    ap.add_argument("--small", action="store_true", help="a CPU smoke run of the harness: the tiny model, short runs")
    args = ap.parse_args(argv)
    c = Check(args)
    if not args.small:
        import torch

        if not torch.cuda.is_available():
            print(
                "error: make gpu-check needs a CUDA GPU (torch sees none); --small runs the harness on CPU.",
                file=sys.stderr,
            )
            return 2
    for name in args.only:
        if c.left() < 20:
            c.results[name] = {"ok": None, "not_run": f"past the {args.deadline:.0f} s deadline"}
            continue
        t0 = time.perf_counter()
        try:
            c.results[name] = globals()[f"stage_{name}"](c)
        except Exception as e:  # a stage's own bug: recorded, and the other stages still run
            import traceback

            c.results[name] = {"ok": False, "error": repr(e), "tail": traceback.format_exc()[-3000:]}
        c.results[name]["stage_s"] = round(time.perf_counter() - t0, 1)
        (c.out / "gpu_check.json").write_text(json.dumps(c.results, indent=1, default=str))
        print(
            f"[{time.perf_counter() - c.t0:6.0f} s] {name}: {json.dumps(c.results[name], default=str)[:1500]}",
            flush=True,
        )
    print(table(c.results))
    return 0 if all(r.get("ok") is not False for r in c.results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
