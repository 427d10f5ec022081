"""make bench's latency levels: repeated runs summarised by median with spread, and the server command
(the recipe's KV cache dtype, tensor parallelism). No vLLM needed: both environments."""

from pipeline.bench.levels import server_command, summarize_runs
from pipeline.schema import load_profile
from pipeline.settings import ROOT, serve_python

from stage_files import write_manifest

SERVE_PYTHON = serve_python()


def test_runs_are_summarised_by_median_with_spread():
    runs = [
        {"p50_ttft_ms": 10.0, "output_throughput": 100.0},
        {"p50_ttft_ms": 30.0, "output_throughput": 90.0},
        {"p50_ttft_ms": 20.0, "output_throughput": 110.0},
    ]
    s = summarize_runs(runs)
    assert s["p50_ttft_ms"] == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert s["output_throughput"]["median"] == 100.0
    assert "p99_itl_ms" not in s  # not reported, not invented


def test_the_recipes_kv_cache_dtype_reaches_the_server(tmp_path):

    profile = load_profile(ROOT / "bench/cpu.yaml")
    recipe = {"file": "recipes/bf16.yaml", "description": "test", "method": "bf16", "backend": "transformers"}
    write_manifest(tmp_path, "tiny", "bf16", recipe=recipe | {"kv_cache_dtype": "fp8"})
    cmd = server_command(tmp_path, profile, 1)
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"
    write_manifest(tmp_path, "tiny", "bf16", recipe=recipe)  # a recipe older than the key
    assert "--kv-cache-dtype" not in server_command(tmp_path, profile, 1)
