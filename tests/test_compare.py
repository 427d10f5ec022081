"""make eval's compare (pipeline/evaluate/compare.py: compare, markdown_table) on files with known differences:
the paired delta's direction, recovery, whether a drop is real, the rows of eval-report.md, and fidelity
figures taken the right way round (KL of the baseline against the variant)."""

import json

import numpy as np
import pytest

from pipeline.evaluate.compare import compare
from pipeline.evaluate.stats import bootstrap_ci, paired_bootstrap_ci
from pipeline.schema import ConfigError, EndpointInfo

from stage_files import eval_results, samples_file

ITEMS = 40


def write_variant(model_dir, variant: str, scores: dict[int, float], reverse: bool = False) -> None:
    """eval/ of one variant: a 0/1 score per item in samples_math.jsonl (written in reverse order with
    `reverse`: compare must pair items by doc_id, not by line) and the results.json entry of that suite."""
    records = [{"doc_id": d, "output": f"#### {d}", "exact_match": s} for d, s in sorted(scores.items())]
    samples_file(model_dir / variant / "eval/samples_math.jsonl", records[::-1] if reverse else records)
    values = list(scores.values())
    mean = float(np.mean(values))
    suite = {
        "file": "eval/math.yaml",
        "metric": "exact_match_numeric",
        "metrics": {"exact_match": {"mean": mean, "ci95": list(bootstrap_ci(values)), "std_across_seeds": 0.0}},
        "n": len(values),
        "seeds": [0],
        "truncated": 0,
        "no_answer": 0,
    }
    (model_dir / variant / "eval/results.json").write_text(json.dumps(eval_results("tiny", variant, {"math": suite})))


def test_a_known_drop_is_negative_real_and_recovered_in_proportion(tmp_path):
    """bf16 gets 20 of 40 items right (mean 0.5); int4 loses 12 of them and gains none (mean 0.2)."""
    pytest.importorskip("scipy")  # McNemar (scipy.stats.binomtest): the serve environment
    model_dir = tmp_path / "tiny"
    base = {d: float(d % 2 == 0) for d in range(ITEMS)}
    lost = [d for d in base if base[d]][:12]
    drop = {d: 0.0 if d in lost else s for d, s in base.items()}
    write_variant(model_dir, "bf16", base)
    write_variant(model_dir, "int4", drop, reverse=True)
    write_variant(model_dir, "same", base)

    report = compare(model_dir, "bf16").model_dump(exclude_unset=True)
    entry = report["variants"]["int4"]["math:exact_match"]
    assert entry["delta"] == pytest.approx(-12 / 40)  # variant minus baseline
    ci = paired_bootstrap_ci(list(drop.values()), list(base.values()))
    assert tuple(entry["delta_ci95"]) == ci and ci[1] < 0  # the whole CI below zero
    assert entry["recovery"] == pytest.approx(0.2 / 0.5)
    assert entry["mcnemar"] == {"lost": 12, "gained": 0, "p_value": pytest.approx(2 * 0.5**12)}
    assert entry["significant"] is True
    same = report["variants"]["same"]["math:exact_match"]
    assert (same["delta"], same["recovery"], same["significant"]) == (0.0, 1.0, False)
    assert "delta" not in report["variants"]["bf16"]["math:exact_match"]

    md = (model_dir / "eval-report.md").read_text().splitlines()
    lo, hi = bootstrap_ci(list(drop.values()))
    row = (
        f"| int4 | math:exact_match | 0.200 | [{lo:.3f}, {hi:.3f}] | 40 | 0 | 0 | -0.300 | 40.0% | "
        f"[{ci[0]:+.3f}, {ci[1]:+.3f}] | 0.000488 | yes |"
    )
    assert row in md
    assert "| same | math:exact_match | 0.500 |" in "\n".join(md) and "| +0.000 | 100.0% |" in "\n".join(md)
    written = json.loads((model_dir / "eval-report.json").read_text())["variants"]["int4"]["math:exact_match"]
    assert written == json.loads(json.dumps(entry))


def fidelity_npz(path, top_probs: list[list[float]], actual_prob: list[float]) -> None:
    """fidelity_<suite>.npz as run_fidelity_suite writes it: per position the top-3 token ids (the same
    three at every position here), their log-probabilities, and the log-probability of the actual token."""
    n = len(top_probs)
    np.savez_compressed(
        path,
        token_ids=np.arange(n, dtype=np.int64),
        logprob=np.log(actual_prob),
        top_ids=np.tile(np.array([10, 11, 12], np.int64), (n, 1)),
        top_logprobs=np.log(top_probs),
    )


def test_a_paired_ci_that_touches_zero_is_not_a_real_difference():
    """'significant' is a paired CI that excludes 0: one whose end is exactly 0 does not. F1-like scores (not
    0/1, so no McNemar): the variant gains half a point on one item of 20 and loses nothing."""
    from pipeline.evaluate.compare import against_baseline
    from pipeline.schema import Accuracy

    theirs = np.full(20, 0.5)
    mine = theirs.copy()
    mine[3] = 1.0
    entry = Accuracy(mean=0.5, ci95=(0.5, 0.5), std_across_seeds=0.0, n=20, seeds=1, truncated=0, no_answer=0)
    e = against_baseline(entry, mine, theirs)
    assert e.delta_ci95[0] == 0.0 < e.delta_ci95[1]  # 36% of resamples miss item 3
    assert e.mcnemar is None and e.significant is False
    e = against_baseline(entry, theirs, mine)  # the same the other way round: the upper end is 0
    assert e.delta_ci95[1] == 0.0 and e.significant is False
    mine[:10] = 1.0  # ten of twenty items gained: the CI's lower end is well above 0
    e = against_baseline(entry, mine, theirs)
    assert e.delta_ci95[0] > 0 and e.significant is True


def test_fidelity_is_the_baselines_kl_to_the_variant_with_each_sides_perplexity(tmp_path):
    model_dir = tmp_path / "tiny"
    suite = {"file": "eval/fidelity.yaml", "metric": "fidelity"}
    p = [[0.8, 0.1, 0.05], [0.5, 0.3, 0.1]]
    q = [[0.4, 0.3, 0.2], [0.5, 0.3, 0.1]]
    for variant, probs, actual in (("bf16", p, [0.8, 0.3]), ("int4", q, [0.4, 0.3])):
        (model_dir / variant / "eval").mkdir(parents=True)
        fidelity_npz(model_dir / variant / "eval/fidelity_held-out.npz", probs, actual)
        (model_dir / variant / "eval/results.json").write_text(
            json.dumps(eval_results("tiny", variant, {"held-out": suite}))
        )
    got = compare(model_dir, "bf16").model_dump(exclude_unset=True)["variants"]["int4"]["held-out"]
    # position 0: the three shared tokens and the rest (0.05 for bf16, 0.1 for int4); position 1 identical
    kl0 = sum(a * np.log(a / b) for a, b in zip([0.8, 0.1, 0.05, 0.05], [0.4, 0.3, 0.2, 0.1]))
    assert got["kld_mean"] == pytest.approx(kl0 / 2)  # KL(bf16 || int4), which KL(int4 || bf16) is not
    assert got["perplexity"] == pytest.approx(np.exp(-np.log([0.4, 0.3]).mean()))
    assert got["baseline_perplexity"] == pytest.approx(np.exp(-np.log([0.8, 0.3]).mean()))
    assert got["top1_agreement"] == 1.0 and got["positions"] == 2
    md = (model_dir / "eval-report.md").read_text()
    assert f"| int4 | held-out: perplexity | {got['perplexity']:.3f} | | 2 | | | +" in md  # worse than bf16


def test_a_suite_scored_as_another_kind_than_the_baselines_is_one_line(tmp_path):
    """A suite name the baseline ran as a fidelity suite and a variant as a generation suite (its file
    replaced between the two runs): one line naming both, not an AttributeError."""
    model_dir = tmp_path / "tiny"
    (model_dir / "bf16/eval").mkdir(parents=True)
    fidelity_npz(model_dir / "bf16/eval/fidelity_held-out.npz", [[0.8, 0.1, 0.05]], [0.8])
    fidelity = {"file": "eval/held-out.yaml", "metric": "fidelity"}
    (model_dir / "bf16/eval/results.json").write_text(json.dumps(eval_results("tiny", "bf16", {"held-out": fidelity})))
    write_variant(model_dir, "int4", {d: 1.0 for d in range(ITEMS)})
    results = json.loads((model_dir / "int4/eval/results.json").read_text())
    results["pipeline"]["suites"] = {"held-out": results["pipeline"]["suites"]["math"] | {"file": "eval/held-out.yaml"}}
    (model_dir / "int4/eval/results.json").write_text(json.dumps(results))
    with pytest.raises(ConfigError, match="held-out was scored as exact_match_numeric, bf16's as fidelity"):
        compare(model_dir, "bf16")


ENDPOINT = {
    "url": "http://127.0.0.1:8000/v1",
    "model": "/models/tiny-gptq",
    "root": "/models/tiny-gptq",
    "max_model_len": 2048,
    "served": ["/models/tiny-gptq"],
    "vllm_version": "0.26.0",
    "checked_at": "2026-12-02T00:00:00+00:00",
}


def test_an_endpoints_results_are_paired_with_the_baseline_and_marked_as_an_endpoint(tmp_path):
    """endpoint-<name>/eval/ (make eval ENDPOINT=...) beside the variants: its figures paired with bf16's on
    the same items like a variant's, and eval-report says what served them."""
    pytest.importorskip("scipy")  # McNemar (scipy.stats.binomtest): the serve environment
    model_dir = tmp_path / "tiny"
    base = {d: float(d % 2 == 0) for d in range(ITEMS)}
    write_variant(model_dir, "bf16", base)
    write_variant(model_dir, "endpoint-tiny-gptq", {d: 0.0 if d < 4 else s for d, s in base.items()})
    results = model_dir / "endpoint-tiny-gptq/eval/results.json"
    doc = json.loads(results.read_text())
    doc["pipeline"] |= {"endpoint": ENDPOINT, "identity": None, "variant": "endpoint-tiny-gptq"}
    results.write_text(json.dumps(doc))

    report = compare(model_dir, "bf16")
    assert report.variants["endpoint-tiny-gptq"]["math:exact_match"].delta == pytest.approx(-2 / 40)
    assert report.endpoints == {"endpoint-tiny-gptq": EndpointInfo(**ENDPOINT)}
    assert report.identities["endpoint-tiny-gptq"] is None
    md = (model_dir / "eval-report.md").read_text()
    assert "| endpoint-tiny-gptq | math:exact_match | 0.450 |" in md
    assert (
        "endpoint-tiny-gptq: a running server evaluated by URL (make eval ENDPOINT=...), not a checkpoint built here: "
        "/models/tiny-gptq at http://127.0.0.1:8000/v1, vLLM 0.26.0, max_model_len 2048" in md
    )


def test_results_under_other_seeds_than_the_baselines_are_not_paired(tmp_path):
    model_dir = tmp_path / "tiny"
    base = {d: float(d % 2 == 0) for d in range(ITEMS)}
    write_variant(model_dir, "bf16", base)
    write_variant(model_dir, "int4", base)
    results = model_dir / "int4/eval/results.json"
    doc = json.loads(results.read_text())
    doc["pipeline"]["suites"]["math"]["seeds"] = [1]
    results.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"int4/eval: math has 40 items under seeds \[1\], bf16 has 40 under \[0\]"):
        compare(model_dir, "bf16")
