"""Figures belong to the checkpoint they were measured on, and a manifest is believed only as far as the
files bear it out (issue 25, items 2 and 3). No engine runs here: the stage files are built by hand
(tests/stage_files.py) around real files, and the stages that would start vLLM are stopped before it.

- eval/results.json, eval-report.json and bench.json record the identity of what they measured
  (schema.Identity: the hash of the files as built, of the recipe, of the calibration token ids);
  report leaves out figures of another checkpoint (the variant cannot qualify), review marks them,
  publish refuses them, each naming the stage to run again.
- size_bytes and the file hashes of a manifest are checked against the files wherever a manifest is
  read (artifacts.read_variant_manifest): an edited size is never a figure, a zeroed hash never
  qualifies.
"""

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.artifacts import read_variant_manifest
from pipeline.identity import stale_figures, tree_hash
from pipeline.schema import ConfigError, Identity
from pipeline.settings import ROOT

from stage_files import (
    bench_record,
    eval_report,
    eval_results,
    identity,
    samples_file,
    variant_manifest,
    write_manifest,
)

METRIC = "synthetic-rc:f1"
SUMMARY = {
    k: {"median": 50.0, "min": 50.0, "max": 50.0, "n": 1}
    for k in [f"p{p}_{m}_ms" for p in (50, 90, 99) for m in ("ttft", "tpot", "itl", "e2el")] + ["output_throughput"]
}


def build(model_dir: Path, name: str, source: Path | None, note: str, **manifest_fields) -> dict:
    """A variant folder as make quantize leaves it (it replaces the folder whole): files, manifest.json
    listing them. From `source` (a checkpoint) or, without one, a stand-in weights file; `note` makes
    the build's bytes its own."""
    folder = model_dir / name
    shutil.rmtree(folder, ignore_errors=True)
    if source is not None:
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("manifest.json"))
    else:
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights " * 100)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "note": note}))
    return write_manifest(folder, model_dir.name, name, **manifest_fields)


def measure(model_dir: Path, manifests: dict[str, dict], weights_gib: dict[str, float]) -> None:
    """bench.json of every variant and the eval-report, each recording what it measured."""
    for name, manifest in manifests.items():
        (model_dir / name / "bench.json").write_text(
            json.dumps(
                bench_record(
                    model_dir.name,
                    name,
                    levels=[{"shape": "chat", "input_len": 8, "output_len": 8, "concurrency": 4, "summary": SUMMARY}],
                    memory={"weights_gib": weights_gib[name]},
                    identity=identity(manifest),
                )
            )
        )
    close = {"mean": 0.3, "ci95": [0.25, 0.35], "delta": 0.0, "delta_ci95": [-0.01, 0.01], "significant": False}
    figures = {n: {METRIC: close if n != "bf16" else {"mean": 0.3, "ci95": [0.25, 0.35]}} for n in manifests}
    (model_dir / "eval-report.json").write_text(
        json.dumps(eval_report(model_dir.name, figures, identities={n: identity(m) for n, m in manifests.items()}))
    )


def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    rule = {
        "description": "the smallest that keeps accuracy",
        "device": "cpu",
        "accuracy": {"max_drop": 0.05},
        "limits": {"chat.c4.p90_tpot_ms": {"max": 100}},
        "objective": [{"minimize": "weights_gib"}],
        "deployment": {"gpu_memory_gib": 24, "max_model_len": 1024, "max_num_seqs": 16},
    }
    path.write_text(yaml.safe_dump(rule))
    return path


@pytest.fixture()
def measured(tmp_path) -> Path:
    """bf16 and int4 (the smaller: the policy's choice), built, benched and evaluated; no real weights."""
    model_dir = tmp_path / "artifacts/tiny"
    manifests = {name: build(model_dir, name, None, "first build") for name in ("bf16", "int4")}
    measure(model_dir, manifests, {"bf16": 0.5, "int4": 0.2})
    return model_dir


def report(model_dir: Path, policy: Path) -> dict:
    pytest.importorskip("matplotlib")  # the serve environment's
    from pipeline.report.assemble import report as make_report

    return make_report(model_dir, policy)


# ------------------------------------------------------------------------- figures and identity


def refused_either_way(variant, expected: str) -> None:
    """The manifest is refused with that one line whether its files are checked by size or by hash."""
    for verify in ("sizes", "hashes"):
        with pytest.raises(ConfigError) as e:
            read_variant_manifest(variant, verify=verify)
        assert str(e.value) == expected


def test_a_rebuilt_variants_old_figures_are_left_out_and_it_cannot_qualify(tmp_path, measured):
    policy = policy_file(tmp_path)
    assert report(measured, policy).chosen == "int4"
    old = identity(json.loads((measured / "int4/manifest.json").read_text()))
    new = identity(build(measured, "int4", None, "rebuilt from another calibration set"))  # eval-report stays
    decision = report(measured, policy)
    expected = (
        f"eval-report.json was measured on int4 {old['checkpoint_sha256'][:8]}…, but {measured / 'int4'} is now "
        f"{new['checkpoint_sha256'][:8]}…: run make eval RECIPES=int4"
    )
    assert decision.chosen == "bf16"  # the only one whose figures are of its files
    assert not decision.verdicts["int4"].qualifies and expected in decision.verdicts["int4"].why
    md = (measured / "report.md").read_text()
    assert "**Stale figures, left out**" in md and f"> - {expected}" in md
    reported = json.loads((measured / "report.json").read_text())["variants"]
    assert METRIC not in reported["int4"]["figures"] and reported["int4"]["measured_on"] == {}
    assert reported["int4"]["checkpoint_sha256"] == new["checkpoint_sha256"]


def test_a_recipe_only_change_with_the_same_weights_makes_the_figures_stale(tmp_path, measured):
    """An fp8 KV cache changes how the variant serves, not one byte of its weights: the figures measured
    with the 16-bit cache are not the new recipe's."""
    policy = policy_file(tmp_path)
    old = identity(json.loads((measured / "int4/manifest.json").read_text()))
    recipe = variant_manifest("tiny", "int4")["recipe"] | {"kv_cache_dtype": "fp8"}
    new = identity(build(measured, "int4", None, "first build", recipe=recipe))  # the same bytes as before
    assert new["checkpoint_sha256"] == old["checkpoint_sha256"] and new["recipe_sha256"] != old["recipe_sha256"]
    decision = report(measured, policy)
    assert decision.chosen == "bf16" and not decision.verdicts["int4"].qualifies
    assert (
        f"was measured on int4 recipe {old['recipe_sha256'][:8]}…, but {measured / 'int4'} is now recipe "
        f"{new['recipe_sha256'][:8]}…" in decision.verdicts["int4"].why
    )


def test_a_stale_bench_is_left_out_even_where_the_policy_needs_no_accuracy(tmp_path, measured):
    bench = json.loads((measured / "int4/bench.json").read_text())
    other = identity(variant_manifest("tiny", "int4", files={"model.safetensors": "1" * 64}))
    (measured / "int4/bench.json").write_text(json.dumps(bench | {"identity": other}))  # another build's bench.json
    rule = yaml.safe_load(policy_file(tmp_path).read_text())
    del rule["accuracy"]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(rule))
    decision = report(measured, tmp_path / "policy.yaml")
    assert decision.chosen == "bf16"
    why = decision.verdicts["int4"].why
    assert f"bench.json was measured on int4 {other['checkpoint_sha256'][:8]}…, but {measured / 'int4'} is now" in why
    assert why.endswith("run make bench BENCH_RECIPES=int4") and "no bench.json" not in why


def test_the_baseline_rebuilt_makes_every_delta_stale(tmp_path, measured):
    build(measured, "bf16", None, "rebuilt")
    decision = report(measured, policy_file(tmp_path))
    assert decision.chosen is None
    assert "eval-report.json (the deltas against bf16) was measured on bf16" in decision.verdicts["int4"].why
    assert "run make eval RECIPES=bf16" in decision.verdicts["int4"].why


def test_figures_that_do_not_say_what_they_measured_are_stale(tmp_path, measured):
    """Files that do not record the identity: unknown, so stale, with what to run."""
    path = measured / "eval-report.json"
    old = json.loads(path.read_text())
    del old["identities"]
    path.write_text(json.dumps(old))
    bench = json.loads((measured / "int4/bench.json").read_text())
    del bench["identity"]
    (measured / "int4/bench.json").write_text(json.dumps(bench))
    why = report(measured, policy_file(tmp_path)).verdicts["int4"].why
    assert "eval-report.json does not record which checkpoint of int4 it measured" in why
    assert "run make eval RECIPES=int4" in why and "run make bench BENCH_RECIPES=int4" in why


def test_eval_compare_carries_each_variants_identity_into_the_eval_report(tmp_path):
    pytest.importorskip("scipy")  # compare's paired test: the serve environment's (make eval)
    from pipeline.evaluate.compare import compare

    model_dir = tmp_path / "tiny"
    ids = {}
    for name in ("bf16", "int4"):
        manifest = build(model_dir, name, None, name)
        ids[name] = identity(manifest)
        records = [{"doc_id": i, "output": "4", "exact_match": 1.0} for i in range(4)]
        samples_file(model_dir / name / "eval/samples_math.jsonl", records)
        suites = {
            "math": {
                "file": "eval/math.yaml",
                "metric": "exact_match_numeric",
                "metrics": {"exact_match": {"mean": 1.0, "ci95": [1.0, 1.0], "std_across_seeds": 0.0}},
                "n": 4,
                "seeds": [0],
                "truncated": 0,
                "no_answer": 0,
            }
        }
        results = eval_results("tiny", name, suites, identity=ids[name])
        (model_dir / name / "eval/results.json").write_text(json.dumps(results))
    compare(model_dir, "bf16")
    assert json.loads((model_dir / "eval-report.json").read_text())["identities"] == ids


# --------------------------------------------------------------------------------------- publish
@pytest.fixture()
def published_chain(tmp_path, tiny_model) -> tuple[Path, Path]:
    """bf16 and small made from the tiny checkpoint, measured; report chose small."""
    model_dir = tmp_path / "artifacts/tiny"
    manifests = {n: build(model_dir, n, tiny_model, "first build") for n in ("bf16", "small")}
    measure(model_dir, manifests, {"bf16": 0.5, "small": 0.2})
    policy = policy_file(tmp_path)
    assert report(model_dir, policy).chosen == "small"
    return model_dir, policy


def test_publish_never_ships_a_rebuilt_checkpoint_with_the_old_ones_figures(tmp_path, published_chain, tiny_model):
    """The issue's scenario: rebuild the chosen variant, run report again as publish says, publish."""
    from pipeline.publish.publishing import publish

    model_dir, policy = published_chain
    manifest = build(model_dir, "small", tiny_model, "rebuilt from another calibration set")
    bench = bench_record(
        "tiny",
        "small",
        levels=[{"shape": "chat", "input_len": 8, "output_len": 8, "concurrency": 4, "summary": SUMMARY}],
        memory={"weights_gib": 0.2},
        identity=identity(manifest),
    )
    (model_dir / "small/bench.json").write_text(json.dumps(bench))  # benched again, but not evaluated
    with pytest.raises(ConfigError, match="small: rebuilt since .*report.json was made; run `make report` again"):
        publish(model_dir, tmp_path / "published")
    report(model_dir, policy)
    dest = publish(model_dir, tmp_path / "published")
    assert dest == tmp_path / "published/tiny-bf16"  # not small, whose figures were of its last build
    assert not (tmp_path / "published/tiny-small").exists()


def test_publish_refuses_a_bench_json_replaced_since_the_report(tmp_path, published_chain):
    from pipeline.publish.publishing import publish

    model_dir, _ = published_chain
    bench = json.loads((model_dir / "small/bench.json").read_text())
    other = identity(variant_manifest("tiny", "small", files={"model.safetensors": "2" * 64}))
    (model_dir / "small/bench.json").write_text(json.dumps(bench | {"identity": other}))
    with pytest.raises(ConfigError) as e:
        publish(model_dir, tmp_path / "published")
    assert str(e.value).startswith(
        f"bench.json was measured on small {other['checkpoint_sha256'][:8]}…, but {model_dir / 'small'} is now "
    )
    assert str(e.value).endswith(": run make bench BENCH_RECIPES=small") and "\n" not in str(e.value)
    assert not (tmp_path / "published").exists()


def test_publish_refuses_a_report_that_does_not_say_what_its_figures_measured(tmp_path, published_chain):
    from pipeline.publish.publishing import publish

    model_dir, _ = published_chain
    path = model_dir / "report.json"
    old = json.loads(path.read_text())
    for entry in old["variants"].values():
        entry.pop("measured_on", None)  # a report.json that does not record it
    path.write_text(json.dumps(old))
    with pytest.raises(ConfigError, match=r"report.json: does not record which checkpoint of small .*make report"):
        publish(model_dir, tmp_path / "published")
    assert not (tmp_path / "published").exists()


# ------------------------------------------------------------------------------ edited manifests
def edit_manifest(folder: Path, **changes) -> None:
    path = folder / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_an_edited_size_is_not_believed_by_any_reader(tmp_path, measured):
    real = json.loads((measured / "int4/manifest.json").read_text())["size_bytes"]
    assert (
        real
        == sum(p.stat().st_size for p in (measured / "int4").glob("model.safetensors"))
        + (measured / "int4/generation_config.json").stat().st_size
    )
    edit_manifest(measured / "int4", size_bytes=10_000_000)
    expected = (
        f"{measured / 'int4/manifest.json'}: size_bytes is 10,000,000, its files add up to {real:,} on disk (edited?); "
        "rebuild it with `make quantize RECIPES=int4 FORCE=1`"
    )
    refused_either_way(measured / "int4", expected)
    with pytest.raises(ConfigError) as e:  # not a report that chooses int4 at size_gib 0.0093
        report(measured, policy_file(tmp_path))
    assert str(e.value) == expected and not (measured / "report.json").exists()


@pytest.mark.parametrize("variant", ["bf16", "int4"])
def test_a_size_edited_down_is_refused_too(tmp_path, measured, variant):
    """The edit that wins on size: a manifest claiming fewer bytes than its files hold (one byte fewer, or
    next to nothing) is as much an edit as one claiming more."""
    real = json.loads((measured / variant / "manifest.json").read_text())["size_bytes"]
    for claimed in (real - 1, 1):
        edit_manifest(measured / variant, size_bytes=claimed)
        expected = (
            f"{measured / variant / 'manifest.json'}: size_bytes is {claimed:,}, its files add up to {real:,} on disk "
            f"(edited?); rebuild it with `make quantize RECIPES={variant} FORCE=1`"
        )
        with pytest.raises(ConfigError) as e:
            read_variant_manifest(measured / variant, verify="sizes")
        assert str(e.value) == expected
    with pytest.raises(ConfigError) as e:
        report(measured, policy_file(tmp_path))
    assert str(e.value) == expected and not (measured / "report.json").exists()


def test_a_zeroed_file_hash_is_caught_before_the_report_qualifies_the_variant(tmp_path, measured):
    manifest = json.loads((measured / "int4/manifest.json").read_text())
    files = manifest["files"] | {"model.safetensors": "0" * 64}
    edit_manifest(measured / "int4", files=files, sha256=tree_hash(files))  # consistent: only the files can tell
    assert read_variant_manifest(measured / "int4", verify="sizes")  # sizes alone cannot see it
    message = (
        f"{measured / 'int4'}: changed since it was built (model.safetensors: sha256 differs from manifest.json); "
        "rebuild it with `make quantize RECIPES=int4 FORCE=1`"
    )
    with pytest.raises(ConfigError) as e:
        report(measured, policy_file(tmp_path))
    assert str(e.value) == message
    assert not (measured / "report.json").exists()


@pytest.mark.parametrize("where", ["../bf16/model.safetensors", "ABSOLUTE"])
def test_a_manifest_listing_a_file_outside_its_folder_is_refused(tmp_path, measured, where):
    """int4's manifest edited to list bf16's weights (hash, tree hash and size all consistent): every check
    of the files would pass, publish would copy that file and write it outside its staging folder."""
    manifest = json.loads((measured / "int4/manifest.json").read_text())
    other = measured / "bf16/model.safetensors"
    rel = str(other) if where == "ABSOLUTE" else where
    files = manifest["files"] | {rel: manifest["files"]["model.safetensors"]}
    size = manifest["size_bytes"] + other.stat().st_size
    edit_manifest(measured / "int4", files=files, sha256=tree_hash(files), size_bytes=size)
    expected = (
        f"{measured / 'int4/manifest.json'}: lists {rel!r}, outside {measured / 'int4'} (edited?); rebuild it with "
        "`make quantize RECIPES=int4 FORCE=1`"
    )
    refused_either_way(measured / "int4", expected)
    with pytest.raises(ConfigError) as e:
        report(measured, policy_file(tmp_path))
    assert str(e.value) == expected


def test_a_zeroed_hash_left_inconsistent_is_caught_by_every_reader(measured):
    manifest = json.loads((measured / "int4/manifest.json").read_text())
    edit_manifest(measured / "int4", files=manifest["files"] | {"model.safetensors": "0" * 64})
    with pytest.raises(ConfigError, match=r"int4/manifest.json: sha256 is not the hash of the files it lists"):
        read_variant_manifest(measured / "int4", verify="sizes")


def test_a_manifest_that_leaves_out_the_weights_describes_another_checkpoint(measured):
    manifest = json.loads((measured / "int4/manifest.json").read_text())
    files = {k: v for k, v in manifest["files"].items() if k != "model.safetensors"}
    edit_manifest(
        measured / "int4",
        files=files,
        sha256=tree_hash(files),
        size_bytes=sum((measured / "int4" / rel).stat().st_size for rel in files),
    )
    with pytest.raises(
        ConfigError, match=r"int4: changed since it was built \(model.safetensors: not in manifest.json\)"
    ):
        read_variant_manifest(measured / "int4")


def test_eval_and_bench_check_the_files_before_any_engine_starts(tmp_path, tiny_model, monkeypatch):
    """A zeroed hash stops eval and bench in their first second, not after the engine has run."""
    model_dir = tmp_path / "artifacts/tiny"
    build(model_dir, "int4", tiny_model, "first build")
    manifest = json.loads((model_dir / "int4/manifest.json").read_text())
    files = manifest["files"] | {"model.safetensors": "0" * 64}
    edit_manifest(model_dir / "int4", files=files, sha256=tree_hash(files))

    class EngineStarted(Exception):
        pass

    def engine(*args, **kwargs):
        raise EngineStarted

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=engine, SamplingParams=engine))
    import pipeline.evaluate.generate as eval_generate
    from pipeline import bench
    from pipeline.evaluate.options import EvalSettings
    from pipeline.evaluate.run import evaluate
    from pipeline.schema import load_profile

    monkeypatch.setattr(eval_generate, "Server", engine)  # eval's server
    changed = r"int4: changed since it was built \(model.safetensors: sha256 differs from manifest.json\)"
    with pytest.raises(ConfigError, match=changed):
        settings = EvalSettings(
            [ROOT / "eval/synthetic-math.yaml"], limit=2, greedy=True, reasoning_flag="no", dtype="auto"
        )
        evaluate(model_dir / "int4", settings)
    monkeypatch.setattr(bench, "Server", engine)
    with pytest.raises(ConfigError, match=changed):
        bench.bench_variant(model_dir / "int4", load_profile(ROOT / "bench/cpu-test.yaml"), Path("cpu-test.yaml"), None)


# ------------------------------------------------------------------------------------------ review
def test_review_marks_what_is_not_about_the_checkpoint_on_disk(tmp_path, measured):
    from pipeline.review.report_tab import report_markdown

    report(measured, policy_file(tmp_path))
    text, _ = report_markdown(measured)
    assert "Stale" not in text
    build(measured, "int4", None, "rebuilt")
    text, _ = report_markdown(measured)
    assert "**Stale**" in text and "| int4 | **chosen** (**stale**) |" in text
    assert "report.json was made from int4 " in text and f"but {measured / 'int4'} is now " in text
    assert text.count("(**stale**)") == 1  # bf16 is as the report saw it

    # the Disagreements tab: an eval/ of another build copied in beside the rebuilt checkpoint
    from pipeline.review.report_tab import eval_staleness

    (measured / "int4/eval").mkdir()
    other = identity(variant_manifest("tiny", "int4", files={"model.safetensors": "3" * 64}))
    (measured / "int4/eval/results.json").write_text(json.dumps(eval_results("tiny", "int4", {}, identity=other)))
    line = eval_staleness(measured, "int4")
    assert line.startswith(
        f"eval/results.json was measured on int4 {other['checkpoint_sha256'][:8]}…, but "
    ) and line.endswith("run make eval RECIPES=int4")
    (measured / "bf16/eval").mkdir()
    bf16 = identity(json.loads((measured / "bf16/manifest.json").read_text()))
    (measured / "bf16/eval/results.json").write_text(json.dumps(eval_results("tiny", "bf16", {}, identity=bf16)))
    assert eval_staleness(measured, "bf16") is None


def test_stale_figures_names_what_differs_and_what_to_run(tmp_path):
    folder = tmp_path / "m/gptq"
    now = Identity(checkpoint_sha256="9ab1" * 16, recipe_sha256="r" * 64, calibration_sha256="c" * 64)
    assert stale_figures("bench.json", now, folder, now, "make bench") is None
    was = now.model_copy(update={"calibration_sha256": "d" * 64})  # same bytes, another calibration set recorded
    assert stale_figures("bench.json", was, folder, now, "make bench") == (
        f"bench.json was measured on gptq calibration dddddddd…, but {folder} is now calibration cccccccc…: "
        "run make bench"
    )
