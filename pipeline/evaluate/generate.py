"""make eval, step 2: the engine, and what it generates (sampled text, or prompt log-probabilities)."""

from __future__ import annotations

import math
import os
import time

import numpy as np

from pipeline.schema import Generation
from pipeline.serving import DataParallelLLM, engine_in_this_process
from pipeline.settings import VLLM_CPU_KVCACHE_SPACE


def start_engine(args: dict, replicas: int, devices: list) -> tuple[object, float, bool]:
    """(engine, load seconds, whether it runs in this process). One replica: the engine in this
    process. Several: one process each on its own GPUs, the requests dealt out round-robin and the
    outputs put back in request order, so the scoring is the same."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_SPACE)
    in_process = engine_in_this_process()
    from vllm import LLM

    t0 = time.time()
    llm = LLM(**args) if replicas == 1 else DataParallelLLM(devices, **args)
    return llm, time.time() - t0, in_process


def generate_all(llm, jobs: dict[str, tuple[list[list[int]], Generation]]) -> tuple[dict[str, dict[int, list]], float]:
    """Every seed of every generation suite in one llm.generate call, each request with its own seed.

    One call keeps the engine's batch full from the first request to the last; a call per suite and
    seed drains it at every boundary, where the long tail of a few long outputs runs nearly alone.
    Returns {suite: {seed: outputs in item order}} and the wall time of the call."""
    from vllm import SamplingParams

    requests, params, keys = [], [], []
    for name, (prompts, gen) in jobs.items():
        for seed in gen.seeds:
            sampling = SamplingParams(
                temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens, seed=seed
            )
            requests += [{"prompt_token_ids": p} for p in prompts]
            params += [sampling] * len(prompts)
            keys += [(name, seed)] * len(prompts)
    t0 = time.time()
    outputs = llm.generate(requests, params, use_tqdm=False) if requests else []
    wall = time.time() - t0
    by_suite: dict[str, dict[int, list]] = {}
    for (name, seed), out in zip(keys, outputs):  # vLLM returns outputs in request order
        by_suite.setdefault(name, {}).setdefault(seed, []).append(out)
    return by_suite, wall


def run_fidelity_suite(llm, suite, prompts, npz_path) -> dict:
    """Next-token log-probabilities of the held-out text (vLLM prompt_logprobs: the served kernels,
    the same engine that generates, for every format; an HF forward could not load the classic
    gptq/awq or FP8 checkpoints in this environment)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=suite.top_logprobs)
    t0 = time.time()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.time() - t0
    k = suite.top_logprobs
    token_ids, logprob, top_ids, top_lp = [], [], [], []
    for prompt, out in zip(prompts, outputs):
        for pos, entry in enumerate(out.prompt_logprobs or []):
            if entry is None:  # the first token has no prediction
                continue
            actual = prompt[pos]
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:k]
            ids = [t for t, _ in ranked] + [-1] * (k - len(ranked))
            lps = [lp.logprob for _, lp in ranked] + [-math.inf] * (k - len(ranked))
            token_ids.append(actual)
            logprob.append(entry[actual].logprob)
            top_ids.append(ids)
            top_lp.append(lps)
    arrays = {
        "token_ids": np.array(token_ids, np.int64),
        "logprob": np.array(logprob, np.float64),
        "top_ids": np.array(top_ids, np.int64),
        "top_logprobs": np.array(top_lp, np.float64),
    }
    np.savez_compressed(npz_path, **arrays)
    return {
        "n": len(prompts),
        "positions": len(token_ids),
        "perplexity": float(np.exp(-arrays["logprob"].mean())),
        "top_k": k,
        "score_s": round(wall, 2),
    }
