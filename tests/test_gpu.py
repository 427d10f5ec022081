"""make test-gpu: the whole chain on an NVIDIA GPU, through make as a user runs it. A tiny random model
with R1-Distill-Qwen-1.5B's tokenizer and chat template (so the reasoning path is taken) is quantized on
the GPU by both backends (llm-compressor: compressed-tensors; GPTQModel: classic gptq/awq), evaluated
with CUDA graphs, benched, reported, published and served from its serve.yaml.

Skipped where no GPU is visible (CI). Needs R1_CONFIG (default ../shared/models/deepseek-r1-distill-qwen-1.5b)
for the config and tokenizer; interpreters from QUANT_PY / SERVE_PY as for make itself.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent
# One variant per kernel path vLLM takes on a GPU: bf16, FP8 (CUTLASS), compressed-tensors INT4
# (Machete/Marlin, made by llm-compressor) and classic GPTQ (gptq_marlin, made by GPTQModel). Four,
# not all six, so the test stays inside ten minutes; every engine start compiles its CUDA graphs.
RECIPES = ["bf16", "fp8-dynamic", "gptq-w4a16", "gptq-w4a16-classic"]
FORMATS = {
    "bf16": "unquantized",
    "fp8-dynamic": "compressed-tensors",
    "gptq-w4a16": "compressed-tensors",
    "gptq-w4a16-classic": "gptq",
}
# Qwen2 like R1-Distill-Qwen-1.5B but 2 layers of width 256: head_dim 128 (FlashAttention's), every
# projection a multiple of 128 so the INT4 Marlin and FP8 kernels take it; R1's vocabulary and context.
TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_window_layers": 2,
}
# A rehearsal (random weights may be published; no accuracy rule, their accuracy means nothing):
# anything that runs qualifies. The test is that a variant is published and served, not which.
POLICY = """description: "make test-gpu: publish the smallest variant that runs."
baseline: bf16
device: cuda
rehearsal: true
limits:
  chat.c8.p90_tpot_ms: {max: 1000}
objective:
  - minimize: weights_gib
deployment: {gpu_memory_gib: 24, max_gpu_memory_utilization: 0.9, max_model_len: 4096, max_num_seqs: 16, replicas: 1}
"""


def gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and "GPU" in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout


@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU visible (nvidia-smi -L)")
def test_the_chain_on_a_gpu(tmp_path):
    r1 = Path(os.environ.get("R1_CONFIG", ROOT / "../shared/models/deepseek-r1-distill-qwen-1.5b"))
    if not (r1 / "config.json").is_file():
        pytest.fail(f"R1_CONFIG={r1}: no config.json; point it at R1-Distill-Qwen-1.5B's config and tokenizer")
    config_dir = tmp_path / "tiny-config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(json.loads((r1 / "config.json").read_text()) | TINY))
    for f in r1.iterdir():
        if f.name != "config.json" and f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, config_dir / f.name)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    model = out / "sources" / "tiny-r1-random"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    quant_py = os.environ.get("QUANT_PY", str(ROOT / ".venv-quant/bin/python"))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    settings = [
        f"OUT={out}",
        f"MODEL={model}",
        f"RECIPES={' '.join(RECIPES)}",
        "CALIB=synthetic-math-chat",
        "DATA_DIR=",
        "SUITES=synthetic-math synthetic-rc fidelity-synthetic",
        "LIMIT=64",
        "MAX_TOKENS=512",
        "BENCH_PROFILE=gpu-test",
        f"POLICY={policy}",
        "BASE_MODEL=",
        "LICENSE=",
    ]
    settings += [f"{k}={os.environ[k]}" for k in ("QUANT_PY", "SERVE_PY") if os.environ.get(k)]
    times = {}

    def step(name, command):
        t0 = time.time()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        times[name] = time.time() - t0
        (logs / f"{name}.log").write_text(proc.stdout + proc.stderr)
        print(f"test-gpu: {name:<17} {times[name]:6.1f} s  rc {proc.returncode}", flush=True)
        assert proc.returncode == 0, f"{name} failed (exit {proc.returncode}):\n" + (proc.stdout + proc.stderr)[-4000:]
        return proc.stdout

    step("source", [quant_py, "-m", "pipeline.source", "random", str(config_dir), str(model)])
    step("quantize", ["make", "--no-print-directory", "quantize", *settings])
    variants = out / model.name
    for recipe in RECIPES:
        manifest = json.loads((variants / recipe / "manifest.json").read_text())
        assert manifest["format"] == FORMATS[recipe], recipe
        if recipe != "bf16":  # bf16 is a copy: nothing to run
            assert manifest["quantize"]["device"] != "cpu", f"{recipe} was quantized on the CPU"
        assert manifest["smoke"]["text"].strip(), f"{recipe}: vLLM generated nothing"

    step("eval", ["make", "--no-print-directory", "eval", *settings])
    for recipe in RECIPES:
        meta = json.loads((variants / recipe / "eval/results.json").read_text())["pipeline"]
        assert meta["enforce_eager"] is False, f"{recipe} was evaluated in eager mode on a GPU"
        assert meta["reasoning_model"] is True  # R1's chat template: the reasoning protocol
        assert meta["generated_tokens"] > 0
    assert (variants / "eval-report.json").is_file()

    step("bench", ["make", "--no-print-directory", "bench", *settings])
    for recipe in RECIPES:
        bench = json.loads((variants / recipe / "bench.json").read_text())
        assert bench["device"] == "cuda" and bench["machine"].get("gpu"), recipe

    step("report", ["make", "--no-print-directory", "report", *settings])
    chosen = json.loads((variants / "report.json").read_text())["decision"]["chosen"]
    assert chosen in RECIPES, "the policy chose nothing: see report.md"

    step("publish", ["make", "--no-print-directory", "publish", *settings])
    assert (out / "published" / f"{model.name}-{chosen}" / "serve.yaml").is_file()
    step("verify-published", ["make", "--no-print-directory", "verify-published", *settings])
    print("test-gpu: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f"; published {chosen}", flush=True)
