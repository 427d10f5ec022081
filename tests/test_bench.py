"""make bench end to end: a real CPU run of a tiny model in which one broken variant fails alone and every
server is stopped (where vLLM is: .venv-serve). The parts, without vLLM: test_bench_memory.py,
test_bench_levels.py, test_bench_cli.py."""

import json
import shutil
import subprocess
from importlib.util import find_spec

import pytest

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.settings import ROOT, serve_python

from stage_files import write_manifest

SERVE_PYTHON = serve_python()


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
