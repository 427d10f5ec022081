"""make eval: answer extraction and equivalence, SQuAD scoring, the statistics on known cases, suite
errors before generation, and a tiny model evaluated end to end in vLLM (runs in .venv-serve)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.evaluate import (bootstrap_ci, build_prompts, compare, extract_numeric, fidelity_stats,
                               is_reasoning_model, last_boxed, load_items, mcnemar_exact, paired_bootstrap_ci,
                               score, settings_for, squad_normalise, squad_scores, strip_thinking)
from pipeline.schema import ConfigError, load_suite

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- extraction, equivalence
@pytest.mark.parametrize("text, expected", [
    ("The total is $1,000.", "1000"),
    ("#### 1,234", "1234"),
    ("so she pays 5.50 dollars\n#### $5.50", "5.5"),
    ("The answer is 42 apples.", "42"),
    ("It costs 3.00", "3"),
    ("Final: \\boxed{\\$1{,}000}", "1000"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("-7 degrees", "-7"),
    ("I am not sure.", None),
])
def test_numeric_extraction_normalises_commas_units_and_trailing_zeros(text, expected):
    assert extract_numeric(text) == expected


def test_numeric_exact_match_compares_normalised_numbers():
    assert score("exact_match_numeric", "This many: $1,000.00 in total", "1000", False)[1]["exact_match"] == 1.0
    assert score("exact_match_numeric", "#### 18", "18", False) == ("18", {"exact_match": 1.0})
    assert score("exact_match_numeric", "#### 180", "18", False)[1]["exact_match"] == 0.0


@pytest.mark.parametrize("output, gold", [
    ("so the result is \\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("the probability is \\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("Hence $x = \\boxed{2\\sqrt{2}}$.", "\\sqrt{8}"),
])
def test_math_answers_are_compared_by_value_not_string(output, gold):
    assert score("exact_match_math", output, gold, False)[1]["exact_match"] == 1.0


def test_math_wrong_or_missing_answers_score_zero():
    assert score("exact_match_math", "\\boxed{\\frac{2}{3}}", "0.5", False)[1]["exact_match"] == 0.0
    assert score("exact_match_math", "I do not know", "\\frac{1}{2}", False) == (None, {"exact_match": 0.0})


def test_boxed_with_nested_braces_and_a_box_cut_off():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}} end") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{\\frac{1}{2") is None


def test_only_text_after_the_think_block_is_scored():
    think = "<think>\n" + "Let me try 17. No, 99 is wrong. " * 200 + "\n</think>\n"
    assert score("exact_match_numeric", think + "The answer is \\boxed{12}.", "12", True) == ("12", {"exact_match": 1.0})
    # the right number inside the thoughts does not count
    assert score("exact_match_numeric", "Maybe 12?\n</think>\nThe answer is 13.", "12", True)[1]["exact_match"] == 0.0
    # a reasoning model still thinking when cut off has no answer (R1's template opens <think> itself)
    assert strip_thinking("Let me think: 12 ... 12 ...", reasoning=True) is None
    assert score("exact_match_numeric", "Let me think: 12 ... 12", "12", True) == (None, {"exact_match": 0.0})
    assert strip_thinking("<think>unfinished 12", reasoning=False) is None
    assert strip_thinking("plain answer 12", reasoning=False) == "plain answer 12"


class ThinkingTokenizer:
    """Just enough of a tokenizer whose chat template, like R1's, handles think blocks."""
    chat_template = "{% if '</think>' in content %}...{% endif %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant><think>\n"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_reasoning_models_get_deepseeks_settings_and_no_system_prompt(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("description: x\ngenerator: arithmetic-word-problems\nnum_items: 2\nprompt: '{question}'\n"
                    "system_prompt: Be brief.\nmetric: exact_match_numeric\n")
    suite, tok = load_suite(path), ThinkingTokenizer()
    assert is_reasoning_model(tok)
    texts, _ = build_prompts(suite, load_items(suite, None, "s", None), tok, True, "s")
    assert texts[0].startswith("<user>") and "Be brief." not in texts[0]
    assert "put your final answer within \\boxed{}" in texts[0]
    gen = settings_for(suite, reasoning=True, seeds=None, greedy=False)
    assert (gen.temperature, gen.top_p, gen.seeds) == (0.6, 0.95, [0, 1, 2])
    plain = settings_for(suite, reasoning=False, seeds=[4, 5], greedy=False)
    assert plain.temperature == 0 and plain.seeds == [4]  # greedy: one seed is all there is
    assert settings_for(suite, reasoning=True, seeds=None, greedy=True).seeds == [0]


# ------------------------------------------------------------------------------------------ SQuAD
def test_squad_normalisation_drops_case_punctuation_articles_and_spaces():
    assert squad_normalise("The  Cat, sat!  ") == "cat sat"
    assert squad_normalise("An apple a day") == "apple day"
    assert squad_normalise("theatre") == "theatre"  # articles only as whole words


def test_squad_f1_and_exact_match_take_the_best_gold():
    assert squad_scores("the cat", ["Cat", "dog"]) == {"exact_match": 1.0, "f1": 1.0}
    s = squad_scores("a black cat sat", ["black dog", "the cat sat down"])
    # vs "cat sat down": pred {black, cat, sat}, overlap 2 -> P 2/3, R 2/3, F1 2/3
    assert s["exact_match"] == 0.0 and s["f1"] == pytest.approx(2 / 3)
    assert squad_scores("nothing", ["cat"]) == {"exact_match": 0.0, "f1": 0.0}
    assert score("squad", "Answer: Lisbon.\nMore text", ["Lisbon"], False) == ("Lisbon.", {"exact_match": 1.0, "f1": 1.0})


# ------------------------------------------------------------------------------------- statistics
def test_bootstrap_ci_on_known_cases():
    assert bootstrap_ci([1.0] * 30) == (1.0, 1.0)
    lo, hi = bootstrap_ci([0.0, 1.0] * 100)  # p = 0.5, n = 200: normal CI is 0.5 +- 1.96 * 0.0354
    assert lo == pytest.approx(0.5 - 0.0693, abs=0.01) and hi == pytest.approx(0.5 + 0.0693, abs=0.01)
    assert bootstrap_ci([0.0, 1.0] * 100) == (lo, hi)  # seeded: the same figures every run


def test_paired_bootstrap_sees_a_consistent_drop_that_unpaired_cis_hide():
    rng = np.random.default_rng(1)
    base = (rng.random(300) < 0.6).astype(float)
    variant = base.copy()
    variant[np.flatnonzero(base)[:15]] = 0  # loses 15 items, gains none: a real 5-point drop
    lo_b, hi_b = bootstrap_ci(base)
    lo_v, hi_v = bootstrap_ci(variant)
    assert lo_b < hi_v  # the two marginal CIs overlap...
    lo, hi = paired_bootstrap_ci(variant, base)
    assert hi < 0 and lo == pytest.approx(-0.05, abs=0.04)  # ...the paired CI excludes zero
    assert paired_bootstrap_ci(base, base) == (0.0, 0.0)


def test_mcnemar_exact_p_values():
    # 5 lost, 0 gained: p = 2 * 0.5**5
    assert mcnemar_exact([0] * 5 + [1] * 5, [1] * 10) == {"lost": 5, "gained": 0, "p_value": 0.0625}
    # 1 lost, 9 gained: p = 2 * (1 + 10) / 2**10
    assert mcnemar_exact([1] * 9 + [0], [0] * 9 + [1])["p_value"] == pytest.approx(0.021484375)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1])["p_value"] == 1.0


def test_fidelity_stats_identical_and_shifted_distributions():
    ids = np.array([[3, 1, 2], [0, 2, 1]])
    p = np.log(np.array([[0.7, 0.2, 0.05], [0.5, 0.3, 0.1]]))
    ref = {"token_ids": np.array([3, 2]), "logprob": p[[0, 1], [0, 1]], "top_ids": ids, "top_logprobs": p}
    same = fidelity_stats(ref, ref)
    assert same["kld_mean"] == pytest.approx(0, abs=1e-12) and same["top1_agreement"] == 1.0
    assert same["perplexity"] == same["baseline_perplexity"]
    q = np.log(np.array([[0.7, 0.2, 0.05], [0.5, 0.3, 0.1]]))
    var = {**ref, "top_ids": np.array([[1, 3, 2], [0, 2, 1]]), "top_logprobs": q, "logprob": np.log([0.2, 0.3])}
    got = fidelity_stats(ref, var)  # position 0: tokens 3 and 1 swap places (.7 <-> .2), the rest as before
    assert got["kld_mean"] == pytest.approx((0.7 * np.log(0.7 / 0.2) + 0.2 * np.log(0.2 / 0.7)) / 2)
    assert got["top1_agreement"] == 0.5 and got["perplexity"] == pytest.approx(np.exp(-np.log([0.2, 0.3]).mean()))
    q2 = np.log(np.array([[0.6, 0.3, 0.05], [0.5, 0.3, 0.1]]))
    got2 = fidelity_stats(ref, {**ref, "top_logprobs": q2})
    exact0 = 0.7 * np.log(0.7 / 0.6) + 0.2 * np.log(0.2 / 0.3) + 0.05 * np.log(1) + 0.05 * np.log(0.05 / 0.05)
    assert got2["kld_mean"] == pytest.approx(exact0 / 2)


# ------------------------------------------------------------------------------------ bad input
def test_shipped_suites_are_valid():
    for path in sorted((ROOT / "eval").glob("*.yaml")):
        assert load_suite(path).description


def test_suite_errors_are_one_line_naming_file_and_key(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nmetric: exact_match_numeric\n")
    with pytest.raises(ConfigError, match=r"s.yaml: prompt: Field required$"):
        load_suite(path)
    path.write_text("description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{question}'\nmetric: bleu\n")
    with pytest.raises(ConfigError, match=r"s.yaml: metric: "):
        load_suite(path)
    path.write_text("description: x\nlocal_file: gsm8k/test.jsonl\nprompt: '{question}'\nmetric: exact_match_numeric\n")
    with pytest.raises(ConfigError, match=r"s.yaml: .*gsm8k/test.jsonl not found; point DATA_DIR"):
        load_items(load_suite(path), str(tmp_path), str(path), None)
    path.write_text("description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{problem}'\nmetric: exact_match_numeric\n")
    with pytest.raises(ConfigError, match=r"s.yaml: field 'problem' is not in the data \(it has answer, question\)"):
        load_items(load_suite(path), None, str(path), None)


def test_limit_keeps_a_fixed_item_order():
    suite = load_suite(ROOT / "eval/synthetic-rc.yaml")
    first = load_items(suite, None, "x", 5)
    assert len(first) == 5 and first == load_items(suite, None, "x", None)[:5]


def test_squad_subset_offline_when_data_dir_is_there():
    data = ROOT.parent / "shared/data"
    if not (data / "squad-subset/expmrc-squad-dev.json").is_file():
        pytest.skip("no local SQuAD copy on this machine")
    rows = load_items(load_suite(ROOT / "eval/squad.yaml"), str(data), "squad", None)
    assert len(rows) == 501 and all(r["answers"] for r in rows)


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.evaluate", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_a_folder_that_is_not_a_checkpoint_fails_before_generation(tmp_path):
    (tmp_path / "v").mkdir()
    proc = run_cli("run", tmp_path / "v", "--suites", ROOT / "eval/synthetic-math.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'v'}: not a checkpoint (needs config.json and *.safetensors); "
                                                "point at a variant made by `make quantize`"]


# ----------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="session")
def embedded_source():
    # The serve environment has no gguf reader: use the source `make source` built (make test does it first).
    built = ROOT / "artifacts/sources/smollm2-135m-instruct"
    if not (built / "manifest.json").is_file():
        pytest.skip("run `make source` first (the eval tests run in .venv-serve, which cannot read the GGUF)")
    return built


SUITES = {
    "math": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 6\nprompt: '{question}'\n"
            "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\ngeneration: {max_tokens: 12}\n",
    "math-sampled": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 4\nprompt: '{question}'\n"
                    "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\n"
                    "generation: {temperature: 0.6, top_p: 0.95, max_tokens: 8, seeds: [0, 1]}\n",
    "rc": "description: x\ngenerator: reading-passages\nnum_items: 6\nprompt: '{context} {question}'\n"
          "gold_field: answers\nmetric: squad\ngeneration: {max_tokens: 8}\n",
    "held-out": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: \"{question}\\n{answer}\"\n"
                "chat_template: false\ngold_field: null\nmetric: fidelity\ntop_logprobs: 5\n",
}


def test_end_to_end_tiny_model_two_identical_variants(tiny_model, tmp_path):
    """The tiny random model scored twice, as bf16 and as an identical copy: every figure must agree,
    every delta be zero and not significant, KLD zero and top-1 agreement one."""
    model_dir = tmp_path / "artifacts/tiny"
    for name in ("bf16", "copy"):
        shutil.copytree(tiny_model, model_dir / name)
    suites = []
    for name, text in SUITES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        suites.append(tmp_path / f"{name}.yaml")
    for name in ("bf16", "copy"):
        proc = run_cli("run", model_dir / name, "--suites", *suites, "--limit", 5)
        assert proc.returncode == 0, proc.stderr[-2000:]

    res = json.loads((model_dir / "copy/eval/results.json").read_text())
    assert {"results", "configs", "versions", "n-samples", "n-shot", "higher_is_better", "config"} <= set(res)
    assert res["n-samples"]["math"] == {"original": 6, "effective": 5}
    assert res["n-samples"]["math-sampled"] == {"original": 4, "effective": 4}
    assert set(res["results"]["rc"]) >= {"exact_match,none", "exact_match_stderr,none", "f1,none", "f1_stderr,none"}
    math = res["pipeline"]["suites"]["math"]
    records = [json.loads(l) for l in (model_dir / "copy/eval/samples_math.jsonl").read_text().splitlines()]
    assert len(records) == 5 and {"prompt", "output", "extracted", "gold", "exact_match", "truncated"} <= set(records[0])
    assert "<|im_start|>user" in records[0]["prompt"]  # the model's chat template
    assert math["truncated"] == sum(r["finish_reason"] == "length" for r in records)
    assert all(r["output_tokens"] <= 12 for r in records)
    sampled = res["pipeline"]["suites"]["math-sampled"]
    assert sampled["seeds"] == [0, 1] and len(sampled["metrics"]["exact_match"]["per_seed"]) == 2
    assert len((model_dir / "copy/eval/samples_math-sampled.jsonl").read_text().splitlines()) == 8

    report = compare(model_dir, "bf16")
    assert (model_dir / "eval-report.md").is_file()
    copy = report["variants"]["copy"]
    for key in ("math:exact_match", "math-sampled:exact_match", "rc:exact_match", "rc:f1"):
        assert copy[key]["delta"] == 0 and copy[key]["delta_ci95"] == (0.0, 0.0) and not copy[key]["significant"]
    assert copy["math:exact_match"]["mcnemar"]["p_value"] == 1.0
    fid = copy["held-out"]
    assert fid["kld_mean"] == pytest.approx(0, abs=1e-6) and fid["top1_agreement"] == 1.0
    assert fid["perplexity"] == pytest.approx(fid["baseline_perplexity"]) and fid["positions"] > 50
