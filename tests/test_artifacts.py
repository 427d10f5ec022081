"""Outputs appear whole or not at all, and manifests hash what they describe."""

import json
from pathlib import Path

import pytest

from pipeline.checkpoint_files import file_hashes, sha256_file, size_on_disk
from pipeline.identity import tree_hash
from pipeline.staging import staging_dir, write_json


def test_staging_dir_moves_into_place_only_when_complete(tmp_path):
    dest = tmp_path / "variant"
    with staging_dir(dest) as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights")
        assert not dest.exists()  # nothing visible while the build runs
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in tmp_path.iterdir()] == ["variant"]  # no temporary folder left behind


def test_failed_build_keeps_the_old_variant_and_leaves_no_trace(tmp_path):
    dest = tmp_path / "variant"
    dest.mkdir()
    (dest / "model.safetensors").write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with staging_dir(dest) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("killed mid-way")
    assert (dest / "model.safetensors").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["variant"]


def test_rebuild_replaces_the_whole_folder(tmp_path):
    dest = tmp_path / "variant"
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"from an older recipe")
    with staging_dir(dest) as tmp:
        (tmp / "new.bin").write_bytes(b"new")
    assert sorted(p.name for p in dest.iterdir()) == ["new.bin"]
    assert oct(dest.stat().st_mode & 0o777) == "0o755"


def test_hashes_cover_every_file_but_the_manifest(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(b"bb")
    write_json(tmp_path / "manifest.json", {"x": 1})
    hashes = file_hashes(tmp_path)
    assert set(hashes) == {"a.txt", "sub/b.txt"}
    assert hashes["a.txt"] == "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"  # sha256("a")
    assert hashes["sub/b.txt"] == sha256_file(tmp_path / "sub" / "b.txt")
    before = tree_hash(hashes)
    (tmp_path / "a.txt").write_bytes(b"A")
    assert tree_hash(file_hashes(tmp_path)) != before
    assert size_on_disk(tmp_path) == 1 + 2 + len((tmp_path / "manifest.json").read_bytes())


def test_write_json_is_atomic_and_readable(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    write_json(path, {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
    # A write that fails, before or after the bytes are out, leaves the old file whole and no temp file.
    with pytest.raises(TypeError):
        write_json(path, {"b": object()})  # not serialisable
    monkeypatch.setattr(Path, "replace", lambda self, target: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        write_json(path, {"b": [3]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_stage_outputs_are_checked_where_they_are_read(tmp_path):
    # A key renamed in a writer (or a file from another version) fails at the reader with one line
    # naming file and key, not later as a silent None in a report.
    from pipeline.artifacts import read_bench, read_eval_run, read_variant_manifest
    from pipeline.checkpoint_files import sha256_file
    from pipeline.schema import ConfigError

    from stage_files import bench_record, eval_results, variant_manifest

    variant = tmp_path / "int4"
    variant.mkdir()
    (variant / "w.bin").write_bytes(b"0123456789")
    manifest = variant_manifest("tiny", "int4", size_bytes=10, files={"w.bin": sha256_file(variant / "w.bin")})
    (variant / "manifest.json").write_text(json.dumps(manifest))
    assert read_variant_manifest(variant).size_bytes == 10
    manifest["size"] = manifest.pop("size_bytes")
    (variant / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"int4/manifest.json: size_bytes: Field required"):
        read_variant_manifest(variant)

    bench = bench_record("tiny", "int4", levels=[], memory={})
    (variant / "bench.json").write_text(json.dumps(bench))
    read, error = read_bench(variant)
    assert error is None and read.model_dump(mode="json", exclude_unset=True) == bench
    (variant / "bench.json").write_text(json.dumps({"variant": "int4", "error": "server exited"}))
    assert read_bench(variant) == (None, "server exited")
    del bench["memory"]["budget_gib"]
    (variant / "bench.json").write_text(json.dumps(bench))
    with pytest.raises(ConfigError, match=r"int4/bench.json: memory.budget_gib: Field required"):
        read_bench(variant)

    assert read_eval_run(variant) is None  # not evaluated
    (variant / "eval").mkdir()
    results = eval_results("tiny", "int4", {"math": {"file": "eval/math.yaml", "metric": "exact_match_math"}})
    (variant / "eval/results.json").write_text(json.dumps(results))
    assert read_eval_run(variant).suites["math"].metric == "exact_match_math"
    del results["pipeline"]["suites"]["math"]["file"]
    (variant / "eval/results.json").write_text(json.dumps(results))
    with pytest.raises(ConfigError, match=r"int4/eval/results.json: suites.math.file: Field required"):
        read_eval_run(variant)


def test_each_reader_returns_its_model_and_refuses_a_bad_file_in_one_line(tmp_path, tiny_model):
    """Readers hand back the model (attributes, defaults filled in once, in the schema), never the dict."""
    from pipeline.artifacts import read_bench, read_eval_report, read_eval_run, read_report, read_variant_manifest
    from pipeline.schema import Bench, ConfigError, EvalReport, Report, VariantManifest

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)
    pytest.importorskip("matplotlib")  # make report's plots: the serve environment's
    from pipeline.report.assemble import report

    report(model_dir, write_policy(tmp_path, max_tpot=100))
    manifest = read_variant_manifest(model_dir / "small")
    assert isinstance(manifest, VariantManifest) and manifest.recipe.kv_cache_dtype == "auto"
    bench, _ = read_bench(model_dir / "small")
    assert isinstance(bench, Bench) and bench.tensor_parallel_size == 1
    written = read_report(model_dir)
    assert isinstance(written, Report) and written.decision.chosen == "small" and written.policy.file.endswith(".yaml")
    assert isinstance(read_eval_report(model_dir), EvalReport) and read_eval_report(model_dir).baseline == "bf16"
    assert read_eval_run(model_dir / "small") is None  # not evaluated (its EvalRun: test above)
    for path, reader, match in (
        ("report.json", lambda: read_report(model_dir), r"report.json: decision: Field required"),
        ("eval-report.json", lambda: read_eval_report(model_dir), r"eval-report.json: baseline: Field required"),
    ):
        data = json.loads((model_dir / path).read_text())
        data.pop(match.split(": ")[1])
        (model_dir / path).write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=match) as e:
            reader()
        assert "\n" not in str(e.value)
    (model_dir / "report.json").unlink()
    with pytest.raises(ConfigError, match=r"report.json: no report; run `make report` first"):
        read_report(model_dir)
