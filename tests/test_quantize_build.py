"""The build around the backends (pipeline/quantize/build.py): build key, up to date, stale folders and the
manifest, with the quantizer and vLLM replaced by stand-ins; the decision logic runs for real, in a second."""

import json
import os
import shutil

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")
pytest.importorskip("gptqmodel")

from pipeline.checkpoint_files import sha256_file
from pipeline.quantize import build
from pipeline.quantize.build import quantize
from pipeline.settings import ROOT


@pytest.fixture
def fake_build(monkeypatch):
    """quantize() with the quantizer and vLLM replaced by stand-ins: the decision logic around them
    (build key, up to date, stale folders) runs for real, in a second."""
    builds = []

    def backend(model_dir, recipe, samples, out, ranks=1):
        builds.append(samples)
        (out / "config.json").write_text("{}")
        return None, None

    monkeypatch.setattr(build, "quantize_llmcompressor", backend)
    monkeypatch.setattr(
        build, "smoke_check", lambda path, kv_cache_dtype="auto": {"loaded": True, "text": " ok", "tokens": 1}
    )
    monkeypatch.setattr(build, "check_servable", lambda recipe, path: None)  # the stand-in serves anything
    return builds


def test_changed_calibration_data_rebuilds_and_the_manifest_says_which_data(tmp_path, tiny_model, fake_build):
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(20)]
    for name in ("data-a", "data-b"):
        (tmp_path / name / "set").mkdir(parents=True)
        (tmp_path / name / "set/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calib = tmp_path / "c.yaml"
    calib.write_text("description: t\nlocal_file: set/train.jsonl\nnum_samples: 8\nmax_seq_len: 64\n")
    recipe, out = ROOT / "recipes/gptq-w4a16.yaml", tmp_path / "out"
    build = lambda data: json.loads(
        (quantize(str(tiny_model), recipe, calib, str(tmp_path / data), out) / "manifest.json").read_text()
    )
    first = build("data-a")
    assert first["calibration"]["data_dir"] == str(tmp_path / "data-a") and "split" not in first["calibration"]
    assert first["calibration"]["data_file_sha256"] == sha256_file(tmp_path / "data-a/set/train.jsonl")
    assert build("data-b")["build_key"] == first["build_key"] and len(fake_build) == 1  # same rows elsewhere: same ids
    rows = [{**r, "question": r["question"].replace("+", "plus")} for r in rows]  # new rows, same file name
    (tmp_path / "data-b/set/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    second = build("data-b")
    assert len(fake_build) == 2 and second["build_key"] != first["build_key"]
    assert second["calibration"]["token_ids_sha256"] != first["calibration"]["token_ids_sha256"]


def test_an_up_to_date_run_removes_what_a_killed_run_left(tmp_path, tiny_model, fake_build, monkeypatch):
    monkeypatch.setattr(build, "export_bf16", lambda model_dir, out: (out / "config.json").write_text("{}"))
    recipe, out = ROOT / "recipes/bf16.yaml", tmp_path / "out"
    quantize(str(tiny_model), recipe, None, None, out)
    dead = out / "tiny-llama" / ".tmp-bf16-999999999-abc123"  # no process has that pid
    live = out / "tiny-llama" / f".tmp-bf16-{os.getpid()}-xyz789"
    dead.mkdir()
    live.mkdir()
    quantize(str(tiny_model), recipe, None, None, out)  # up to date
    assert not dead.exists() and live.exists()


def test_an_up_to_date_variant_whose_files_no_longer_match_its_manifest_is_rebuilt(
    tmp_path, tiny_model, fake_build, monkeypatch, capsys
):
    exports = []

    def export(model_dir, out):
        exports.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(build, "export_bf16", export)
    recipe, out = ROOT / "recipes/bf16.yaml", tmp_path / "out"
    dest = quantize(str(tiny_model), recipe, None, None, out)
    quantize(str(tiny_model), recipe, None, None, out)
    assert len(exports) == 1 and "up to date" in capsys.readouterr().out
    (dest / "config.json").write_text('{"edited": true}')  # same build key, other files
    quantize(str(tiny_model), recipe, None, None, out)
    assert len(exports) == 2 and "rebuilding" in capsys.readouterr().out
    assert (dest / "config.json").read_text() == "{}"


def test_up_to_date_variant_is_not_rebuilt_and_a_changed_recipe_is(tiny_model, tmp_path, fake_build, monkeypatch):
    # the decision runs for real; the build is a stand-in (the chain test builds bf16 through make)
    monkeypatch.setattr(build, "export_bf16", lambda model_dir, out: (out / "config.json").write_text("{}"))
    recipe, out = tmp_path / "bf16.yaml", tmp_path / "out"
    shutil.copy(ROOT / "recipes/bf16.yaml", recipe)
    first = quantize(str(tiny_model), recipe, None, None, out)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert quantize(str(tiny_model), recipe, None, None, out) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp  # untouched
    recipe.write_text(recipe.read_text().replace("Baseline.", "Baseline, described anew."))
    quantize(str(tiny_model), recipe, None, None, out)
    assert (first / "manifest.json").stat().st_mtime_ns != stamp
