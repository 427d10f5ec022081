"""The source model's own answers to calibration prompts (calibration sets with `responses: model`).

    python -m pipeline.quantize.traces MODEL_DIR PROMPTS.json OUT.json --max-tokens 512 --seed 0

PROMPTS.json is a list of token-id lists (the chat template already applied by the quantize stage,
generation prompt included); OUT.json gets {"output_ids": [...], "finish_reasons": [...], "sampling": {...}}.
Runs in the serve environment (vLLM), called by make quantize as a subprocess, like pipeline/quantize/smoke.py;
quantize caches the result under OUT/<model>/calibration/ and hashes the token ids it feeds the quantizer.

Sampling: greedy, except for R1-style reasoning models, which loop under greedy decoding and are
sampled as DeepSeek recommends (temperature 0.6, top-p 0.95), each prompt with its own seed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pipeline import exits
from pipeline.quiet import quiet
from pipeline.schema import REASONING_GENERATION
from pipeline.serving import (
    cpu_dtype,
    engine_children_die_with_parent,
    is_reasoning_model,
    on_gpu,
)
from pipeline.settings import VLLM_CPU_KVCACHE_SPACE
from pipeline.staging import write_json

# the eval stage's protocol for reasoning models (DeepSeek's), without its length cap and seeds
DEEPSEEK_SAMPLING = {"temperature": REASONING_GENERATION.temperature, "top_p": REASONING_GENERATION.top_p}


def generate(model: str, prompts: list[list[int]], max_tokens: int, seed: int) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_SPACE)
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = DEEPSEEK_SAMPLING if is_reasoning_model(AutoTokenizer.from_pretrained(model)) else {"temperature": 0.0}
    t0 = time.time()
    llm = LLM(
        model=model,
        dtype="auto" if on_gpu() else cpu_dtype(),
        max_model_len=max(map(len, prompts)) + max_tokens,
        seed=seed,
        enforce_eager=not on_gpu(),
    )
    params = [SamplingParams(max_tokens=max_tokens, seed=seed + i, **sampling) for i in range(len(prompts))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return {
        "output_ids": [list(o.outputs[0].token_ids) for o in outs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outs],
        "sampling": {**sampling, "max_tokens": max_tokens, "seed": seed},
        "seconds": round(time.time() - t0, 1),
    }


def main() -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("prompts", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    result = generate(args.model, json.loads(args.prompts.read_text()), args.max_tokens, args.seed)
    write_json(args.out, result)
    return 0


if __name__ in ("__main__", "__mp_main__"):  # __mp_main__: an engine process vLLM spawned re-imports this module
    engine_children_die_with_parent()
if __name__ == "__main__":
    exits.finish(main())
