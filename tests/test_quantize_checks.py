"""The quantize stage's input checks (pipeline/quantize/checks.py): each failure is one line naming the setting,
raised before any long work, and leaves nothing behind."""

import json
import os
import shutil
from pathlib import Path

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")
pytest.importorskip("gptqmodel")

from pipeline.quantize import checks
from pipeline.quantize.build import quantize
from pipeline.quantize.checks import check_modules, resolve_model, source_identity
from pipeline.schema import ConfigError, load_recipe
from pipeline.settings import ROOT

CALIB = "description: small and fast\ngenerator: arithmetic-word-problems\nnum_samples: 16\nmax_seq_len: 128\nseed: 0\n"


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "tiny.yaml"
    path.write_text(CALIB)
    return path


def test_group_size_that_does_not_divide_names_the_first_layer(tmp_path, embedded_source):
    recipe = tmp_path / "g128.yaml"
    recipe.write_text("description: x\nmethod: gptq\nbackend: llmcompressor\ngroup_size: 128\n")
    with pytest.raises(
        ConfigError, match=r"group_size: 128 does not divide the 576 input features of model.layers.0.self_attn.q_proj"
    ):
        check_modules(embedded_source, load_recipe(recipe))
    check_modules(embedded_source, load_recipe(ROOT / "recipes/gptq-w4a16.yaml"))  # 64 divides 576 and 1536


def test_model_errors(tmp_path):
    with pytest.raises(ConfigError, match="MODEL=.*: no config.json there"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"MODEL=.*: holds no weights"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="no such folder, and not a hub id"):
        resolve_model(str(tmp_path / "nope" / "deeper" / "still"))


def flip(path: Path, offset: int, n: int = 16) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def test_random_model_from_a_config_without_tokenizer_is_one_line(tmp_path):
    from pipeline.source import main as source_main

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg/config.json").write_text("{}")
    assert source_main(["random", str(tmp_path / "cfg"), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_damaged_source_is_refused_not_built_under_the_good_hash(tmp_path, tiny_model):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    good = source_identity(copy).sha256
    flip(copy / "model.safetensors", (copy / "model.safetensors").stat().st_size // 2)
    with pytest.raises(
        ConfigError, match=r"MODEL=.*copy: model.safetensors: sha256 differs from manifest.json \(damaged or edited"
    ):
        source_identity(copy)
    # without a manifest (a folder from elsewhere) the identity is the hash of what is on disk
    (copy / "manifest.json").unlink()
    assert source_identity(copy).sha256 != good


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("truncate", r"model.safetensors is \d+ bytes, its header says \d+ \(truncated or damaged\)"),
        ("header", r"model.safetensors is not a readable safetensors file"),
        ("config", r"config.json is not valid JSON"),
        ("custom", r"model_type 'my_arch' is not one transformers knows and needs its own code \(auto_map"),
    ],
)
def test_a_broken_model_folder_is_one_line_and_leaves_nothing(tmp_path, tiny_model, damage, expected):
    copy = tmp_path / "broken"
    shutil.copytree(tiny_model, copy)
    (copy / "manifest.json").unlink()
    weights = copy / "model.safetensors"
    if damage == "truncate":
        os.truncate(weights, weights.stat().st_size - 1000)
    elif damage == "header":
        flip(weights, 9, 4)
    elif damage == "config":
        (copy / "config.json").write_text('{"model_type": "llama",')
    else:
        (copy / "config.json").write_text(json.dumps({"model_type": "my_arch", "auto_map": {"AutoModel": "m.M"}}))
    out = tmp_path / "artifacts"
    with pytest.raises(ConfigError, match=f"^MODEL={copy}: {expected}") as e:
        quantize(str(copy), ROOT / "recipes/bf16.yaml", None, None, out)
    assert "\n" not in str(e.value)
    assert not (out / "broken").exists()


def test_gptq_without_calibration_is_one_line(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match=r"gptq-w4a16.yaml: method gptq needs calibration data; set CALIB"):
        quantize(str(tiny_model), ROOT / "recipes/gptq-w4a16.yaml", None, None, tmp_path)


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_out_that_cannot_be_written_is_refused_before_building(tiny_model, tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" if where == "file" else tmp_path / "a-file" / "artifacts"
    with pytest.raises(ConfigError, match=rf"^OUT={out}: cannot write there"):
        quantize(str(tiny_model), ROOT / "recipes/bf16.yaml", None, None, out)
    assert "building" not in capsys.readouterr().out


def test_an_ignore_entry_that_matches_no_module_is_refused(tmp_path, tiny_model):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("description: x\nmethod: fp8-dynamic\nbackend: llmcompressor\nignore: [lm_hed]\n")
    with pytest.raises(
        ConfigError, match=r"ignore: 'lm_hed' matches no module of tiny-llama \(did you mean 'lm_head'\?\)"
    ):
        check_modules(tiny_model, load_recipe(recipe))
    recipe.write_text(
        "description: x\nmethod: fp8-dynamic\nbackend: llmcompressor\nignore: [lm_head, 're:.*down_proj']\n"
    )
    check_modules(tiny_model, load_recipe(recipe))


def test_dp_that_cannot_run_is_one_line_before_any_work(tiny_model, calib, tmp_path, monkeypatch, capsys):
    gptq, classic = ROOT / "recipes/gptq-w4a16.yaml", ROOT / "recipes/gptq-w4a16-classic.yaml"
    cases = [
        (classic, 2, [], r"gptq-w4a16-classic.yaml: DP=2: only llm-compressor's GPTQ and AWQ .* leave DP unset$"),
        (ROOT / "recipes/awq-w4a16.yaml", 2, [], r"awq-w4a16.yaml: DP=2: distributed AWQ needs GPUs, and none is"),
        (gptq, 2, ["3"], r"^DP=2: one GPU a rank, and 1 visible \(3\); lower DP$"),
        (gptq, (os.cpu_count() or 1) + 1, [], r"no GPU visible, and CPU ranks need a core each"),
        (gptq, 0, [], r"^DP=0: must be at least 1$"),
    ]
    for recipe, ranks, gpus, message in cases:
        monkeypatch.setattr(checks, "visible_gpus", lambda gpus=gpus: gpus)
        with pytest.raises(ConfigError, match=message):
            quantize(str(tiny_model), recipe, calib, None, tmp_path / "out", ranks=ranks)
    assert "building" not in capsys.readouterr().out and not (tmp_path / "out").exists()
    # nothing to calibrate: DP asks for nothing, one process builds bf16
    assert checks.check_ranks(2, load_recipe(ROOT / "recipes/bf16.yaml"), "bf16.yaml") == 1


def test_missing_serve_interpreter_is_one_line_before_any_work(tiny_model, calib, tmp_path, monkeypatch, capsys):
    """The smoke test runs vLLM in the serve environment after the quantizer: a missing interpreter is
    found first, not after minutes of quantizing."""
    monkeypatch.setenv("SERVE_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(ConfigError, match=r"^SERVE_PYTHON=.*no-such-python: not found; run `make setup`"):
        quantize(str(tiny_model), ROOT / "recipes/gptq-w4a16.yaml", calib, None, tmp_path / "out")
    assert "building" not in capsys.readouterr().out and not (tmp_path / "out").exists()
