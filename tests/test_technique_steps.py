"""What each technique buys (pipeline/evaluate/techniques.py, pipeline/evaluate/steps.py, pipeline/report/steps.py):
which variant is which other's step, from the recipes as manifests record them; eval's paired differences
of a step on the same items and positions; the report's row with size and decode latency."""

import json

import numpy as np
import pytest

from pipeline.evaluate.techniques import steps
from pipeline.schema import load_recipe
from pipeline.settings import ROOT

from stage_files import eval_results, identity, samples_file, write_manifest

ITEMS = 40


def recorded(name: str) -> dict:
    """A recipe of recipes/ as a manifest records it (Recipe.used, and its file)."""
    return load_recipe(ROOT / f"recipes/{name}.yaml").used() | {"file": f"recipes/{name}.yaml"}


def test_each_variant_is_a_step_over_the_variant_that_lacks_only_the_keys_it_adds():
    names = ["bf16", "bf16-kv8", "fp8-dynamic", "gptq-w4a16", "gptq-w4a16-quip-b64", "gptq-w4a16-quip-b64-mixed8"]
    names += ["awq-w4a16"]
    got = {(s.variant, s.base): s.added for s in steps({n: recorded(n) for n in names})}
    assert got == {
        ("bf16-kv8", "bf16"): {"kv_cache_dtype": "fp8"},
        ("gptq-w4a16-quip-b64", "gptq-w4a16"): {
            "rotation": "quip",
            "rotation_block_size": 64,
            "rotation_precision": "float32",
        },
        # over the rotated variant, its nearest base, not over plain gptq-w4a16 as well
        ("gptq-w4a16-quip-b64-mixed8", "gptq-w4a16-quip-b64"): {"size_budget": 1.1, "sensitive_bits": 8},
    }
    # a key the base sets away from its default is no technique the variant adds: never the other way round,
    # and a different method (awq, fp8-dynamic) has no default to be a step from
    assert not [s for s in steps({n: recorded(n) for n in names}) if s.base == "gptq-w4a16-quip-b64-mixed8"]


def test_nearest_bases_are_all_kept_where_two_are_equally_near():
    plain = recorded("gptq-w4a16")
    both = plain | {"size_budget": 1.1, "observer": "mse"}
    got = {
        (s.variant, s.base)
        for s in steps(
            {"plain": plain, "both": both, "mixed": plain | {"size_budget": 1.1}, "mse": plain | {"observer": "mse"}}
        )
    }
    assert got == {("mixed", "plain"), ("mse", "plain"), ("both", "mixed"), ("both", "mse")}


def fidelity_npz(path, top_probs: list[list[float]]) -> None:
    n = len(top_probs)
    np.savez_compressed(
        path,
        token_ids=np.arange(n, dtype=np.int64),
        logprob=np.log([p[0] for p in top_probs]),
        top_ids=np.tile(np.array([10, 11, 12], np.int64), (n, 1)),
        top_logprobs=np.log(top_probs),
    )


def test_compare_pairs_a_rotation_with_plain_int4_on_the_same_items_and_positions(tmp_path):
    """bf16 gets 20 of 40 items right; plain INT4 loses 12 of them; the rotated INT4 loses only 2 of those
    12, so over plain INT4 it gains 10 items and loses none. Fidelity: the rotated variant's distribution is
    nearer bf16's than plain INT4's at every position."""
    pytest.importorskip("scipy")  # McNemar: the serve environment
    from pipeline.evaluate.compare import compare

    model_dir = tmp_path / "tiny"
    base = {d: float(d % 2 == 0) for d in range(ITEMS)}
    right = [d for d in base if base[d]]
    scores = {
        "bf16": base,
        "gptq-w4a16": {d: 0.0 if d in right[:12] else s for d, s in base.items()},
        "gptq-w4a16-quip-b64": {d: 0.0 if d in right[:2] else s for d, s in base.items()},
    }
    probs = {"bf16": [0.8, 0.1, 0.05], "gptq-w4a16": [0.4, 0.3, 0.2], "gptq-w4a16-quip-b64": [0.7, 0.15, 0.1]}
    suites = {
        "math": {"file": "eval/math.yaml", "metric": "exact_match_numeric"},
        "held-out": {"file": "eval/fidelity.yaml", "metric": "fidelity"},
    }
    for name, items in scores.items():
        folder = model_dir / name
        samples_file(
            folder / "eval/samples_math.jsonl",
            [{"doc_id": d, "output": "x", "exact_match": s} for d, s in items.items()],
        )
        fidelity_npz(folder / "eval/fidelity_held-out.npz", [probs[name]] * 6)
        mean = float(np.mean(list(items.values())))
        math = suites["math"] | {"n": ITEMS, "metrics": {"exact_match": {"mean": mean, "ci95": [mean, mean]}}}
        manifest = write_manifest(folder, "tiny", name, recipe=recorded(name))
        run = {"math": math, "held-out": suites["held-out"] | {"n": 6}}
        (folder / "eval/results.json").write_text(
            json.dumps(eval_results("tiny", name, run, identity=identity(manifest)))
        )

    report = compare(model_dir, "bf16")
    (step,) = report.techniques
    assert (step.variant, step.base) == ("gptq-w4a16-quip-b64", "gptq-w4a16")
    assert step.added == {"rotation": "quip", "rotation_block_size": 64, "rotation_precision": "float32"}
    acc = step.figures["math:exact_match"]
    assert (acc.base_value, acc.value, acc.delta) == pytest.approx((8 / 40, 18 / 40, 10 / 40))
    assert acc.mcnemar == {"lost": 0, "gained": 10, "p_value": pytest.approx(2 * 0.5**10)}
    assert acc.significant is True
    kld = step.figures["held-out:kld"]
    # each side's KL to bf16, as the variants' own rows give it; the step is their paired difference
    rows = report.variants
    assert kld.base_value == pytest.approx(rows["gptq-w4a16"]["held-out"].kld_mean)
    assert kld.value == pytest.approx(rows["gptq-w4a16-quip-b64"]["held-out"].kld_mean)
    assert kld.delta == pytest.approx(kld.value - kld.base_value) and kld.delta < 0
    assert kld.mcnemar is None and step.figures["held-out:top1"].delta == 0.0
    md = (model_dir / "eval-report.md").read_text()
    assert "| gptq-w4a16-quip-b64 | gptq-w4a16 | rotation: quip, rotation_block_size: 64, rotation_precision: " in md
    written = json.loads((model_dir / "eval-report.json").read_text())["techniques"]
    assert written == [json.loads(step.model_dump_json())]
    # plain INT4 rebuilt since its eval (its recipe's description edited, say: still the rotated one's base by
    # its keys): its figures are another checkpoint's, so no step
    rebuilt = recorded("gptq-w4a16") | {"description": "rebuilt"}
    write_manifest(model_dir / "gptq-w4a16", "tiny", "gptq-w4a16", recipe=rebuilt)
    assert compare(model_dir, "bf16").techniques == []


def test_the_report_shows_a_step_with_its_size_and_decode_latency_against_its_base(tmp_path, tiny_model):
    pytest.importorskip("matplotlib")  # the report: the serve environment
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)  # bf16 (p50 TPOT 50 ms) and small (60 ms), among others
    eval_report = json.loads((model_dir / "eval-report.json").read_text())
    figure = {"base_value": 0.30, "value": 0.29, "delta": -0.01, "delta_ci95": [-0.03, 0.01], "significant": False}
    eval_report["techniques"] = [
        {"variant": "small", "base": "bf16", "added": {"kv_cache_dtype": "fp8"}, "figures": {"synthetic-rc:f1": figure}}
    ]
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report))
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    md = (model_dir / "report.md").read_text()
    size = (
        json.loads((model_dir / "small/manifest.json").read_text())["size_bytes"]
        / json.loads((model_dir / "bf16/manifest.json").read_text())["size_bytes"]
    )
    row = (
        "| small | bf16 | kv_cache_dtype: fp8 | — | synthetic-rc:f1 0.300 → 0.290, Δ -0.010 [-0.030, +0.010] | "
        f"{size:.3f}x | chat c8: 50.00 → 60.00 ms (1.20x) |"
    )
    assert "## What each technique buys" in md and row in md


def test_a_steps_size_is_the_variants_over_its_bases_and_latency_needs_both_benched_on_one_device():
    from types import SimpleNamespace

    from pipeline.report.steps import technique_lines
    from pipeline.schema import TechniqueStep

    report = [TechniqueStep(variant="rotated", base="plain", added={"rotation": "quip"}, figures={})]
    one = lambda size, bench=None: SimpleNamespace(
        manifest=SimpleNamespace(size_bytes=size), bench=bench, bench_device="cpu", eval={}
    )
    (row,) = [line for line in technique_lines(report, {"rotated": one(3), "plain": one(4)}) if "| rotated |" in line]
    assert row.endswith("| 0.750x | — |")
    stale = one(3)
    stale.eval = None  # its eval figures left out (measured on another checkpoint): its steps too
    assert technique_lines(report, {"rotated": stale, "plain": one(4)}) == []
