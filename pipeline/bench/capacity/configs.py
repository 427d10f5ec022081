"""A grid config's vLLM server settings: serve.yaml's names for what its server ran with, and the engine
arguments that start it."""

from __future__ import annotations

from pipeline.schema import Profile, ServingConfig
from pipeline.serving import cuda_graph_settings, on_gpu

# the settings a config may set that serving.vllm_server_command does not take by name
EXTRA = (
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "api_server_count",
    "stream_interval",
)


def server_settings(config: ServingConfig | None, profile: Profile, kv_cache_dtype: str = "auto") -> dict:
    """The vLLM flags a config's server runs with, as serve.yaml names them; unset ones are the profile's
    (max-num-seqs, gpu-memory-utilization, max-model-len, max-cudagraph-capture-size, else the project's CUDA
    graph rule), the recipe's KV cache dtype (kv_cache_dtype), or left to vLLM (not listed)."""
    o = config.overrides() if config is not None else {}
    settings = {
        "max-model-len": profile.max_model_len,
        "max-num-seqs": o.get("max_num_seqs", profile.max_num_seqs),
        "gpu-memory-utilization": o.get("gpu_memory_utilization", profile.gpu_memory_utilization),
    }
    graphs = o.get("max_cudagraph_capture_size", profile.max_cudagraph_capture_size)
    if graphs is not None:
        if on_gpu() and not profile.enforce_eager:
            settings["max-cudagraph-capture-size"] = graphs
    else:
        settings |= cuda_graph_settings(settings["max-num-seqs"], profile.enforce_eager)  # as its server runs
    for key in EXTRA:
        if key in o:
            settings[key.replace("_", "-")] = o[key]
    kv = o.get("kv_cache_dtype", kv_cache_dtype)
    if kv != "auto":
        settings["kv-cache-dtype"] = kv
    return settings


def engine_arguments(config: ServingConfig | None, profile: Profile, kv_cache_dtype: str = "auto") -> dict:
    """serving.vllm_server_command's keyword arguments for the config's server."""
    o = config.overrides() if config is not None else {}
    return {
        "max_num_seqs": o.get("max_num_seqs", profile.max_num_seqs),
        "gpu_memory_utilization": o.get("gpu_memory_utilization", profile.gpu_memory_utilization),
        "kv_cache_dtype": o.get("kv_cache_dtype", kv_cache_dtype),
        "max_cudagraph_capture_size": o.get("max_cudagraph_capture_size", profile.max_cudagraph_capture_size),
        "extra": {key: o[key] for key in EXTRA if key in o},
    }


def not_chosen_because(config: ServingConfig, recipe_kv_cache_dtype: str) -> str | None:
    """Why a config may be measured but never shipped; None where it may be."""
    kv = config.kv_cache_dtype
    if kv is not None and kv != recipe_kv_cache_dtype:
        return (
            f"kv-cache-dtype {kv}: eval measured this variant's accuracy with the KV cache {recipe_kv_cache_dtype}; "
            "a recipe with kv_cache_dtype: fp8 ships it"
        )
    return None
