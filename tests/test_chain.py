"""The whole chain through make, as a user runs it: quantize, eval, bench, report, publish and
verify-published, in a temporary OUT, on a tiny random model. The stages meet only through the files
they write, so this is where report and publish read what quantize, eval and bench really wrote.

- CPU (`make test`): a 2-layer Llama with SmolLM2's tokenizer (tests/conftest.py), bf16 and gptq-w4a16,
  bench/cpu-test.yaml. Runs in the serve environment's pytest (make calls both interpreters itself).
- GPU (`make test-gpu`): a 2-layer Qwen2 with R1-Distill-Qwen-1.5B's tokenizer and chat template (so the
  reasoning path is taken), quantized on the GPU by both backends (llm-compressor: compressed-tensors;
  GPTQModel: classic gptq), evaluated with CUDA graphs, bench/gpu-test.yaml. Skipped where no GPU is
  visible. Needs R1_CONFIG (default ../shared/models/deepseek-r1-distill-qwen-1.5b) for the config and
  tokenizer; interpreters from QUANT_PY / SERVE_PY as for make itself.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.artifacts import file_hashes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FORMATS = {
    "bf16": "unquantized",
    "fp8-dynamic": "compressed-tensors",
    "gptq-w4a16": "compressed-tensors",
    "gptq-w4a16-classic": "gptq",
}
# Qwen2 like R1-Distill-Qwen-1.5B but 2 layers of width 256: head_dim 128 (FlashAttention's), every
# projection a multiple of 128 so the INT4 Marlin and FP8 kernels take it; R1's vocabulary and context.
TINY_QWEN2 = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_window_layers": 2,
}
# A rehearsal (random weights may be published; no accuracy rule, their accuracy means nothing):
# anything that runs qualifies. The test is that a variant is published and served, not which.
POLICY = """description: "the chain test: publish the smallest variant that runs."
baseline: bf16
device: {device}
rehearsal: true
limits:
  chat.c{level}.p90_tpot_ms: {{max: 10000}}
objective:
  - minimize: weights_gib
deployment: {{gpu_memory_gib: 24, max_gpu_memory_utilization: 0.9, max_model_len: 1024, max_num_seqs: 16, replicas: 1}}
"""


def gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and "GPU" in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout


def run_chain(tmp_path: Path, model: Path, recipes: list[str], device: str, settings: list[str]) -> dict:
    """make quantize ... verify-published with these settings; returns what each stage wrote."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(device=device, level=4 if device == "cpu" else 8))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    settings = [
        f"OUT={out}",
        f"MODEL={model}",
        f"RECIPES={' '.join(recipes)}",
        "CALIB=synthetic-math-chat",
        "DATA_DIR=",
        "SUITES=synthetic-math synthetic-rc fidelity-synthetic",
        f"POLICY={policy}",
        "BASE_MODEL=",
        "LICENSE=",
        *settings,
        *(f"{k}={os.environ[k]}" for k in ("QUANT_PY", "SERVE_PY") if os.environ.get(k)),
    ]
    times = {}

    def step(target):
        t0 = time.time()
        proc = subprocess.run(
            ["make", "--no-print-directory", target, *settings], cwd=ROOT, env=env, capture_output=True, text=True
        )
        times[target] = time.time() - t0
        (logs / f"{target}.log").write_text(proc.stdout + proc.stderr)
        print(f"chain: {target:<17} {times[target]:6.1f} s  rc {proc.returncode}", flush=True)
        assert proc.returncode == 0, f"{target} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        return proc.stdout

    variants = out / model.name
    step("quantize")
    manifests = {r: json.loads((variants / r / "manifest.json").read_text()) for r in recipes}
    for recipe, manifest in manifests.items():
        assert manifest["format"] == FORMATS[recipe], recipe
        assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8, recipe
        assert manifest["smoke"]["text"].strip(), f"{recipe}: vLLM generated nothing"
        assert manifest["files"] == file_hashes(variants / recipe), recipe  # exactly what is there
        assert manifest["random_weights"] and manifest["banner"] == "random weights — not for accuracy"
        if recipe in ("bf16", "fp8-dynamic"):  # data-free methods
            assert manifest["calibration"] is None
        else:
            assert len(manifest["calibration"]["token_ids_sha256"]) == 64, recipe
    assert not list(variants.glob(".tmp-*"))

    step("eval")
    results = {r: json.loads((variants / r / "eval/results.json").read_text())["pipeline"] for r in recipes}
    for recipe, meta in results.items():
        assert meta["generated_tokens"] > 0, recipe
    compared = json.loads((variants / "eval-report.json").read_text())["variants"]
    assert set(compared) == set(recipes)
    for recipe in recipes:
        if recipe != "bf16":  # every accuracy figure paired with bf16's on the same items
            accuracy = [e for e in compared[recipe].values() if "mean" in e]
            assert accuracy and all("delta_ci95" in e for e in accuracy), recipe

    step("bench")
    benches = {r: json.loads((variants / r / "bench.json").read_text()) for r in recipes}
    for recipe, bench in benches.items():
        assert bench["device"] == device and bench["levels"], recipe

    step("report")
    chosen = json.loads((variants / "report.json").read_text())["decision"]["chosen"]
    assert chosen in recipes, "the policy chose nothing: see report.md"

    step("publish")
    published = out / "published" / f"{model.name}-{chosen}"
    assert (published / "serve.yaml").is_file() and (published / "manifest.json").is_file()
    served = step("verify-published")
    assert "/health: 200" in served and "without the API key: 401" in served and "server stopped" in served
    print("chain: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f"; published {chosen}", flush=True)
    return {"manifests": manifests, "results": results, "benches": benches, "chosen": chosen}


# Where a GPU is visible every stage runs on it: `make test-gpu` runs the chain there, with its assertions.
@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: make test-gpu runs the chain on it")
def test_the_chain_on_the_cpu(tmp_path, tiny_model):
    pytest.importorskip("vllm")  # once, from the serve environment: make itself calls both
    recipes = ["bf16", "gptq-w4a16"]
    chain = run_chain(
        tmp_path,
        tiny_model,
        recipes,
        "cpu",
        ["LIMIT=8", "MAX_TOKENS=32", "BENCH_PROFILE=cpu-test"],
    )
    for recipe in recipes:
        # the offline engines ran in the stage's own process (pipeline/serving.py: engine_in_this_process)
        assert chain["manifests"][recipe]["smoke"]["engine_in_process"] is True, recipe
        meta = chain["results"][recipe]
        assert meta["enforce_eager"] is True and meta["engine_in_process"] is True, recipe
        assert meta["reasoning_model"] is False  # SmolLM2's template has no think block
        levels = chain["benches"][recipe]["levels"]
        assert [(lv["concurrency"], len(lv["runs"])) for lv in levels] == [(1, 1), (4, 1)], recipe
    assert chain["benches"]["bf16"]["hf_baseline"][0]["e2e_s"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU visible (nvidia-smi -L)")
def test_the_chain_on_a_gpu(tmp_path):
    r1 = Path(os.environ.get("R1_CONFIG", ROOT / "../shared/models/deepseek-r1-distill-qwen-1.5b"))
    if not (r1 / "config.json").is_file():
        pytest.fail(f"R1_CONFIG={r1}: no config.json; point it at R1-Distill-Qwen-1.5B's config and tokenizer")
    config_dir = tmp_path / "tiny-config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(json.loads((r1 / "config.json").read_text()) | TINY_QWEN2))
    for f in r1.iterdir():
        if f.name != "config.json" and f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, config_dir / f.name)
    model = tmp_path / "out" / "sources" / "tiny-r1-random"
    quant_py = os.environ.get("QUANT_PY", str(ROOT / ".venv-quant/bin/python"))
    subprocess.run([quant_py, "-m", "pipeline.source", "random", str(config_dir), str(model)], cwd=ROOT, check=True)
    # One variant per kernel path vLLM takes on a GPU: bf16, FP8 (CUTLASS), compressed-tensors INT4
    # (Machete/Marlin, made by llm-compressor) and classic GPTQ (gptq_marlin, made by GPTQModel).
    recipes = ["bf16", "fp8-dynamic", "gptq-w4a16", "gptq-w4a16-classic"]
    chain = run_chain(tmp_path, model, recipes, "cuda", ["LIMIT=64", "MAX_TOKENS=512", "BENCH_PROFILE=gpu-test"])
    for recipe in recipes:
        if recipe != "bf16":  # bf16 is a copy: nothing to run
            assert chain["manifests"][recipe]["quantize"]["device"] != "cpu", f"{recipe} was quantized on the CPU"
        meta = chain["results"][recipe]
        assert meta["enforce_eager"] is False, f"{recipe} was evaluated in eager mode on a GPU"
        assert meta["reasoning_model"] is True  # R1's chat template: the reasoning protocol
        assert chain["benches"][recipe]["machine"].get("gpu"), recipe
