"""How fast the eval stage drives vLLM, against vLLM's own LLM.generate on the same prompts, side by side.

    python bench/eval_engine_ratio.py VARIANT_DIR --suite eval/gsm8k.yaml --data-dir DATA \\
        [--limit 512] [--max-tokens 1024] [--seed 0] [--out ratio.json]

Four processes one after another, each with one engine on the device:
  stage-cold   `python -m pipeline.evaluate run` on the suite, limit, seed and token cap given
  plain-cold   vLLM's defaults (LLM(model), CUDA graphs, torch.compile), one generate call
  stage, plain the same again, now with torch.compile's cache warm for each (the two differ in
               max-model-len, so each compiles its own graph once)
The prompts are the stage's own (load_items of pipeline/data.py, build_prompts and settings_for of
pipeline/evaluate/plan.py), so both generate from identical token ids with identical sampling
parameters. Prints one table and writes --out: generated tokens/s and engine start-up (LLM()
constructed) of each, and the stage's ratios to plain vLLM, warm against warm and cold against cold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stage_prompts(variant: Path, suite_path: Path, data_dir: str, limit: int, seed: int, max_tokens: int):
    """Token ids and sampling settings exactly as `pipeline.evaluate run` builds them."""
    from transformers import AutoTokenizer

    from pipeline.data import load_items
    from pipeline.evaluate import build_prompts, settings_for
    from pipeline.schema import load_suite
    from pipeline.serving import is_reasoning_model

    suite = load_suite(suite_path)
    rows = load_items(suite, data_dir, str(suite_path), limit)
    tokenizer = AutoTokenizer.from_pretrained(variant)
    reasoning = is_reasoning_model(tokenizer)
    _, prompts = build_prompts(suite, rows, tokenizer, reasoning, str(suite_path))
    return prompts, settings_for(suite, reasoning, [seed], False, max_tokens)


def plain(args) -> dict:
    """vLLM as a user would call it: LLM(model) with its defaults, one generate call."""
    from vllm import LLM, SamplingParams

    prompts, gen = stage_prompts(args.variant, args.suite, args.data_dir, args.limit, args.seed, args.max_tokens)
    t0 = time.time()
    llm = LLM(model=str(args.variant), seed=0)
    load_s = time.time() - t0
    params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens, seed=args.seed)
    t0 = time.time()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    generate_s = time.time() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "load_s": round(load_s, 1),
        "generate_s": round(generate_s, 2),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / generate_s, 1),
        "requests": len(prompts),
        "sampling": {"temperature": gen.temperature, "top_p": gen.top_p, "max_tokens": gen.max_tokens},
    }


def run(cmd: list[str], log: Path) -> int:
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as f:
        return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=1800).returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", type=Path)
    p.add_argument("--suite", type=Path, default=ROOT / "eval/gsm8k.yaml")
    p.add_argument("--data-dir", default=os.environ.get("DATA_DIR"))
    p.add_argument("--limit", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("eval-engine-ratio.json"))
    # which runs first matters (compile and kernel caches warm up for the ones after): give the order
    p.add_argument("--order", default="stage-cold,plain-cold,stage,plain")
    p.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    if args.plain_only:
        print("PLAIN " + json.dumps(plain(args)), flush=True)
        os._exit(0)  # vLLM's teardown can hang at interpreter exit; the engine dies with us (parent-death signal)

    common = [
        str(args.variant),
        "--suite",
        str(args.suite),
        "--limit",
        str(args.limit),
        "--max-tokens",
        str(args.max_tokens),
        "--seed",
        str(args.seed),
    ] + (["--data-dir", args.data_dir] if args.data_dir else [])
    logs = args.out.with_suffix("")
    figures = {}
    runs = tuple(args.order.split(","))
    for label in runs:
        log = Path(f"{logs}.{label}.log")
        if label.startswith("stage"):
            cmd = [
                sys.executable,
                "-m",
                "pipeline.evaluate",
                "run",
                str(args.variant),
                "--suites",
                str(args.suite),
                "--limit",
                str(args.limit),
                "--seeds",
                str(args.seed),
                "--max-tokens",
                str(args.max_tokens),
            ]
            cmd += ["--data-dir", args.data_dir] if args.data_dir else []
            rc = run(cmd, log)
            meta = json.loads((args.variant / "eval/results.json").read_text())["pipeline"] if rc == 0 else {}
            figures[label] = {
                k: meta.get(k) for k in ("load_s", "generate_s", "generated_tokens", "tokens_per_s", "enforce_eager")
            } | {"rc": rc}
        else:
            rc = run([sys.executable, __file__, *common, "--plain-only"], log)
            line = next((l for l in log.read_text().splitlines() if l.startswith("PLAIN ")), None)
            figures[label] = (json.loads(line[6:]) if line else {}) | {"rc": rc}
        print(f"{label}: {figures[label]}", flush=True)
    for label in runs:  # each stage<suffix> against plain<suffix>
        suffix = label.removeprefix("stage")
        stage, ref = figures.get(label, {}), figures.get(f"plain{suffix}", {})
        if label.startswith("stage") and stage.get("tokens_per_s") and ref.get("tokens_per_s"):
            figures[f"ratio_tokens_per_s{suffix}"] = round(stage["tokens_per_s"] / ref["tokens_per_s"], 3)
            figures[f"ratio_load_s{suffix}"] = round(stage["load_s"] / ref["load_s"], 3)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print("\n| run | engine start s | generate s | tokens | tok/s |\n|---|---|---|---|---|")
    for label in runs:
        f = figures[label]
        print(
            f"| {label} | {f.get('load_s')} | {f.get('generate_s')} | {f.get('generated_tokens')} | "
            f"{f.get('tokens_per_s')} |"
        )
    print("\nstage / plain: " + "; ".join(f"{k} {v}" for k, v in figures.items() if k.startswith("ratio_")))
    return 0 if any(k.startswith("ratio_") for k in figures) else 1


if __name__ in ("__main__", "__mp_main__"):  # spawned engine processes re-import this module
    sys.path.insert(0, str(ROOT))
    from pipeline.serving import engine_children_die_with_parent

    engine_children_die_with_parent()
if __name__ == "__main__":
    sys.exit(main())
