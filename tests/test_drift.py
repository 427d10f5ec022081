"""Drift: an input file edited after the figures were made from it (a recipe after its variant was built, a
suite after eval, a bench profile after bench, a policy after the report), or a checkpoint file replaced
after quantize, is refused in one line naming the file and what to run, before any long work
(pipeline/drift.py, artifacts.read_variant_manifest). Both environments; the report's and publish's need
matplotlib (.venv-serve)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from fake_engine import ArithmeticClient

from pipeline import drift
from pipeline.artifacts import read_variant_manifest
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import plan_suites
from pipeline.evaluate.run import generate_suites, prepare, score_and_write
from pipeline.evaluate.write import EngineRun
from pipeline.schema import ConfigError, load_recipe, load_suite
from pipeline.settings import ROOT

from stage_files import write_manifest

SUITE = ROOT / "eval/synthetic-math.yaml"


def built_variant(tmp_path: Path, tiny_model: Path, recipe_name: str) -> tuple[Path, Path]:
    """(the variant folder, its recipe file): the tiny checkpoint as make quantize leaves it, its manifest
    recording the recipe (a copy of recipes/<recipe_name>.yaml under tmp_path) as quantize reads it."""
    recipe = tmp_path / f"recipes/{recipe_name}.yaml"
    recipe.parent.mkdir(parents=True)
    shutil.copy(ROOT / f"recipes/{recipe_name}.yaml", recipe)
    variant = tmp_path / f"artifacts/tiny/{recipe_name}"
    shutil.copytree(tiny_model, variant, ignore=shutil.ignore_patterns("manifest.json"))
    write_manifest(variant, "tiny", recipe_name, recipe={"file": str(recipe), **load_recipe(recipe).used()})
    return variant, recipe


def prepare_eval(variant: Path):
    """make eval's every check before its server starts (pipeline.evaluate.run.prepare)."""
    return prepare(variant, EvalSettings([SUITE], limit=1, dtype="float16"))


# ------------------------------------------------------------------------------------ the recipe
def test_eval_refuses_a_recipe_edited_since_its_variant_was_built(tmp_path, tiny_model):
    """Issue 42's case: recipes/gptq-w4a16.yaml's group_size 64 -> 32 after the build; eval would spend its
    minutes on a variant that is not what the recipe now says."""
    variant, recipe = built_variant(tmp_path, tiny_model, "gptq-w4a16")
    recipe.write_text(recipe.read_text().replace("group_size: 64", "group_size: 32"))
    with pytest.raises(ConfigError) as e:
        prepare_eval(variant)
    assert str(e.value) == (
        f"{recipe}: group_size is 32, but {variant}/manifest.json was made with 64; rebuild it with "
        "`make quantize-gptq-w4a16 FORCE=1`, or put the file back"
    )


def test_a_comment_or_a_description_is_not_drift(tmp_path, tiny_model):
    """Neither changes what quantize builds (nor its build key): eval goes ahead."""
    variant, recipe = built_variant(tmp_path, tiny_model, "gptq-w4a16")
    text = recipe.read_text().replace("group_size: 64", "group_size: 64  # still 64")
    recipe.write_text(text.replace("description: GPTQ INT4", "description: GPTQ 4-bit"))
    assert prepare_eval(variant).plan.manifest.recipe.group_size == 64


def test_a_calibration_set_edited_since_the_build_is_drift(tmp_path, tiny_model):
    variant, _ = built_variant(tmp_path, tiny_model, "gptq-w4a16")
    calib = tmp_path / "calib/synthetic-math-chat.yaml"
    calib.parent.mkdir()
    shutil.copy(ROOT / "calib/synthetic-math-chat.yaml", calib)
    settings = drift.calib_settings(calib)
    record = {"file": str(calib), **settings, "samples": 1, "tokens": 8, "token_ids_sha256": "1" * 64}
    manifest = json.loads((variant / "manifest.json").read_text()) | {"calibration": record}
    (variant / "manifest.json").write_text(json.dumps(manifest))
    drift.check_unchanged(drift.variant_inputs(variant, read_variant_manifest(variant)))  # as built
    calib.write_text(calib.read_text().replace(f"num_samples: {settings['num_samples']}", "num_samples: 7"))
    with pytest.raises(ConfigError) as e:
        drift.check_unchanged(drift.variant_inputs(variant, read_variant_manifest(variant)))
    assert str(e.value) == (
        f"{calib}: num_samples is 7, but {variant}/manifest.json was made with {settings['num_samples']}; "
        "rebuild it with `make quantize-gptq-w4a16 CALIB=synthetic-math-chat FORCE=1`, or put the file back"
    )


# ------------------------------------------------------------------------------- the checkpoint
def test_a_checkpoint_file_replaced_by_a_symlink_is_refused_by_every_reader(tmp_path, tiny_model):
    """Same bytes behind the link today; the manifest cannot speak for where it points tomorrow."""
    variant, _ = built_variant(tmp_path, tiny_model, "bf16")
    elsewhere = tmp_path / "elsewhere.safetensors"
    (variant / "model.safetensors").rename(elsewhere)
    (variant / "model.safetensors").symlink_to(elsewhere)
    for verify in ("sizes", "hashes"):
        with pytest.raises(ConfigError) as e:
            read_variant_manifest(variant, verify=verify)
        assert f"(model.safetensors: a symlink to {elsewhere}); rebuild it with" in str(e.value)


def test_a_config_edited_after_quantize_is_caught_without_hashing_the_weights(tmp_path, tiny_model):
    """config.json, tokenizer, chat template: a few MB, hashed on every manifest read (the size alone
    cannot see an edit of the same length)."""
    variant, _ = built_variant(tmp_path, tiny_model, "bf16")
    config = variant / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 2e-05'))
    with pytest.raises(ConfigError) as e:
        read_variant_manifest(variant, verify="sizes")
    assert str(e.value) == (
        f"{variant}: changed since it was built (config.json: sha256 differs from manifest.json); "
        "rebuild it with `make quantize RECIPES=bf16 FORCE=1`"
    )


# ----------------------------------------------------------------------------------- the suites
def evaluated(variant: Path, tokenizer_dir: Path, suite: Path) -> None:
    """variant/eval/ as make eval writes it (score_and_write), from a deterministic stand-in server."""
    settings = EvalSettings([suite], limit=2, reasoning_flag="no")
    plan = plan_suites(tokenizer_dir, settings)
    plan.variant = variant
    engine = EngineRun(args={}, eager=None, replicas=None, tp=None)
    client = ArithmeticClient()
    (variant / "eval").mkdir(parents=True)
    score_and_write(client, plan, generate_suites(client, plan, engine), settings, engine, ({}, {}), variant / "eval")


def test_the_eval_report_refuses_a_suite_edited_since_its_results(tmp_path, embedded_source):
    from pipeline.evaluate.compare import compare

    suite = tmp_path / "synthetic-math.yaml"
    shutil.copy(SUITE, suite)
    model_dir = tmp_path / "artifacts/tiny"
    evaluated(model_dir / "bf16", embedded_source, suite)
    recorded = json.loads((model_dir / "bf16/eval/results.json").read_text())["pipeline"]["suites"]
    assert recorded["synthetic-math"]["settings_sha256"] == drift.suite_sha256(load_suite(suite))
    assert "bf16" in compare(model_dir, "bf16").variants  # as measured
    suite.write_text(suite.read_text().replace("max_tokens: 256", "max_tokens: 128"))
    with pytest.raises(ConfigError) as e:
        compare(model_dir, "bf16")
    assert str(e.value) == (
        f"{suite}: changed since {model_dir}/bf16/eval/results.json was made from it; run `make eval RECIPES=bf16` "
        "again"
    )


# ---------------------------------------------------------------------- the profile and the policy
@pytest.fixture()
def repository(tmp_path, monkeypatch) -> Path:
    """A repository root of the test's own, so that its bench/ and policies/ can be edited: bench.json and
    report.json name their profile and policy relative to it."""
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "bench/cpu.yaml", root / "bench/cpu.yaml")
    monkeypatch.setattr(drift, "ROOT", root)
    return root


def test_the_report_refuses_a_bench_profile_edited_since_bench(tmp_path, tiny_model, repository):
    pytest.importorskip("matplotlib")  # the report's plots
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)  # bench.json of bench/cpu.yaml
    policy = write_policy(tmp_path, max_tpot=100)
    report(model_dir, policy)
    (model_dir / "report.json").unlink()
    profile = repository / "bench/cpu.yaml"
    profile.write_text(profile.read_text().replace("\nconcurrency: [1, 8]", "\nconcurrency: [1, 4]"))
    with pytest.raises(ConfigError) as e:
        report(model_dir, policy)
    assert str(e.value) == (
        f"bench/cpu.yaml: concurrency is [1, 4], but {model_dir}/bf16/bench.json was made with [1, 8]; run "
        "`make bench BENCH_RECIPES=bf16 BENCH_PROFILE=cpu` again"
    )
    assert not (model_dir / "report.json").exists()


def test_the_report_refuses_a_recipe_edited_since_its_variant_was_built(tmp_path, tiny_model, repository):
    pytest.importorskip("matplotlib")
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)  # bf16's manifest: recipes/bf16.yaml as it reads now
    (repository / "recipes").mkdir()
    recipe = repository / "recipes/bf16.yaml"
    shutil.copy(ROOT / "recipes/bf16.yaml", recipe)
    policy = write_policy(tmp_path, max_tpot=100)
    report(model_dir, policy)
    recipe.write_text(recipe.read_text() + "kv_cache_dtype: fp8\n")
    with pytest.raises(ConfigError) as e:
        report(model_dir, policy)
    assert str(e.value) == (
        f"recipes/bf16.yaml: kv_cache_dtype is 'fp8', but {model_dir}/bf16/manifest.json was made with 'auto'; "
        "rebuild it with `make quantize-bf16 FORCE=1`, or put the file back"
    )


def test_publish_refuses_a_policy_edited_since_the_report(tmp_path, tiny_model, repository):
    pytest.importorskip("matplotlib")
    from pipeline.publish.publishing import publish
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)
    policy = write_policy(repository, max_tpot=100)  # repo/policy.yaml: report.json names it policy.yaml
    assert report(model_dir, policy).chosen == "small"
    policy.write_text(policy.read_text().replace("max: 100", "max: 55"))  # now only bf16 would qualify
    with pytest.raises(ConfigError) as e:
        publish(model_dir, tmp_path / "published")
    assert str(e.value) == (
        f"policy.yaml: limits.chat.c8.p90_tpot_ms.max is 55.0, but {model_dir}/report.json was made with 100.0; "
        "run `make report POLICY=policy.yaml` again"
    )
    assert not (tmp_path / "published").exists()


def test_a_file_no_longer_there_is_not_compared(tmp_path, tiny_model):
    """Nothing on disk then says other than the record: the variant is what its manifest says it is."""
    variant, recipe = built_variant(tmp_path, tiny_model, "gptq-w4a16")
    os.remove(recipe)
    drift.check_unchanged(drift.variant_inputs(variant, read_variant_manifest(variant)))
