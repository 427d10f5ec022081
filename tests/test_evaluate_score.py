"""pipeline/evaluate/score.py and plan.py's sampling settings: k samples per problem, pass@1 with the
clustered CI and cons@k in a suite's entry, and a thinking model cut off before </think> counted as
truncated and scored as no answer. The engine is a stand-in that returns fixed texts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.evaluate.compare import compare
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import settings_for
from pipeline.evaluate.score import ScoredSuite, score_generation_suite
from pipeline.openai_client import Completion
from pipeline.schema import load_suite
from pipeline.settings import ROOT

from stage_files import eval_results


def outputs_by_seed(texts_per_seed: list[list[tuple[str, str]]]) -> dict:
    return {seed: [Completion(t, [0] * 3, f) for t, f in texts] for seed, texts in enumerate(texts_per_seed)}


def suite_file(tmp_path, extra: str = "") -> Path:
    path = tmp_path / "comp.yaml"
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 2\nprompt: '{question}'\n"
        "metric: exact_match_numeric\n" + extra
    )
    return path


def test_k_samples_are_seeds_with_fewer_on_a_cpu_and_samples_overrides(tmp_path, monkeypatch):
    import pipeline.evaluate.plan as plan

    suite = load_suite(suite_file(tmp_path, "generation: {temperature: 0.6, samples: 16, samples_on_cpu: 2}\n"))
    monkeypatch.setattr(plan, "on_gpu", lambda: True)
    assert settings_for(suite, False, EvalSettings()).seeds == list(range(16))
    monkeypatch.setattr(plan, "on_gpu", lambda: False)
    assert settings_for(suite, False, EvalSettings()).seeds == [0, 1]
    assert settings_for(suite, False, EvalSettings(samples=5)).seeds == [0, 1, 2, 3, 4]
    assert settings_for(suite, False, EvalSettings(seeds=[7, 8], samples=5)).seeds == [7, 8]  # explicit seeds win
    for shipped in ("aime24", "amc23"):
        gen = load_suite(ROOT / f"eval/{shipped}.yaml").reasoning_generation
        assert (gen.temperature, gen.top_p, gen.samples, gen.max_tokens) == (0.6, 0.95, 16, 32_768)


def test_samples_below_one_is_a_one_line_error(tmp_path):
    bad = suite_file(tmp_path, "generation: {temperature: 0.6, samples: 0}\n")
    with pytest.raises(Exception, match="samples"):
        load_suite(bad)
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.evaluate", "run", str(tmp_path), "--suites", str(bad), "--samples", "0"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == "error: SAMPLES=0: must be at least 1 sample per item"


def test_pass_at_1_cons_at_k_and_a_cut_off_thought_in_a_suites_entry(tmp_path):
    suite = load_suite(suite_file(tmp_path, "generation: {temperature: 0.6, samples: 3}\n"))
    rows = [{"question": "q1", "answer": "7"}, {"question": "q2", "answer": "3"}]
    gen = settings_for(suite, True, EvalSettings())
    # item 0: right, right, still thinking (stopped, but no </think>: cut off); item 1: 5, 3, 5
    texts = [
        [("<think>a</think> #### 7", "stop"), ("<think>b</think> #### 5", "stop")],
        [("<think>c</think> #### 7", "stop"), ("<think>d</think> #### 3", "stop")],
        [("<think>so 7 it is", "stop"), ("<think>e</think> #### 5", "stop")],
    ]
    path = tmp_path / "samples_comp.jsonl"
    scored = ScoredSuite(suite, rows, ["q1", "q2"], [[1], [2, 3]], gen, reasoning=True)
    r = score_generation_suite(scored, outputs_by_seed(texts), 1.0, path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    # each line is its own item's: its prompt and prompt length, under each seed
    assert {(rec["doc_id"], rec["prompt"], rec["prompt_tokens"]) for rec in records} == {(0, "q1", 1), (1, "q2", 2)}
    cut = [rec for rec in records if rec["seed"] == 2 and rec["doc_id"] == 0][0]
    assert cut["truncated"] and cut["no_answer"] and cut["extracted"] is None and cut["exact_match"] == 0
    assert r["truncated"] == 1 and r["seeds"] == [0, 1, 2]
    assert r["metrics"]["exact_match"]["mean"] == pytest.approx(3 / 6)  # pass@1: the mean over samples
    assert r["cons_at_k"]["k"] == 3 and r["cons_at_k"]["mean"] == pytest.approx(0.5)  # 7 wins item 0; 5 item 1


def test_a_suites_pass_at_1_without_the_cut_off_samples_is_pooled_over_the_samples_left():
    from pipeline.evaluate.score import summarise

    # item 0: 4 of 4 right; item 1: one sample wrong, three cut off: 4 of the 5 completed samples right
    per_seed = [[{"exact_match": 1.0}, {"exact_match": 0.0}] for _ in range(4)]
    truncated = [[False, False]] + [[False, True]] * 3
    got = summarise(["exact_match"], per_seed, truncated)["exact_match"]
    assert got["mean"] == pytest.approx(4 / 8)
    assert got["mean_completed"] == pytest.approx(0.8)  # stats.pass_at_1 of the ragged table, not 0.5


def test_a_suites_ci_resamples_items_so_one_seed_still_has_a_width():
    from pipeline.evaluate.score import summarise
    from pipeline.evaluate.stats import cluster_bootstrap_ci

    items = [{"exact_match": float(i % 2)} for i in range(40)]  # half the items right
    one_seed = summarise(["exact_match"], [items], [[False] * 40])["exact_match"]
    lo, hi = one_seed["ci95"]
    assert lo < 0.5 < hi and hi - lo > 0.2  # about 0.5 +- 0.16; resampling the one seed gives (0.5, 0.5)
    # three seeds that agree on every item: the spread is between items, not seeds
    three = summarise(["exact_match"], [items] * 3, [[False] * 40] * 3)["exact_match"]
    assert three["ci95"] == cluster_bootstrap_ci([[float(i % 2)] * 3 for i in range(40)])
    assert three["ci95"][1] - three["ci95"][0] > 0.2


def test_a_suites_own_think_end_token_closes_the_thought(tmp_path):
    suite = load_suite(suite_file(tmp_path, "think_end_token: '<|end_of_thought|>'\n"))
    rows = [{"question": "q1", "answer": "7"}]
    gen = settings_for(suite, True, EvalSettings(seeds=[0]))
    texts = [[("thinking<|end_of_thought|> #### 7", "stop")]]
    path = tmp_path / "samples_comp.jsonl"
    r = score_generation_suite(ScoredSuite(suite, rows, ["q1"], [[1]], gen, True), outputs_by_seed(texts), 1.0, path)
    assert r["truncated"] == 0 and r["metrics"]["exact_match"]["mean"] == 1.0


def test_compare_pairs_cons_at_k_per_problem_and_orders_suites_hardest_first(tmp_path):
    pytest.importorskip("scipy")  # compare's paired test: the serve environment's (make eval)
    model_dir = tmp_path / "m"
    easy = load_suite(suite_file(tmp_path))
    hard = load_suite(suite_file(tmp_path, "generation: {temperature: 0.6, samples: 2}\n"))
    rows = [{"question": "q1", "answer": "7"}, {"question": "q2", "answer": "3"}]
    runs = {  # (easy: one sample; hard: two) per variant
        "bf16": ([[("#### 7", "stop"), ("#### 3", "stop")]], [[("#### 7", "stop"), ("#### 1", "stop")]] * 2),
        "int4": ([[("#### 7", "stop"), ("#### 3", "stop")]], [[("#### 2", "stop"), ("#### 1", "stop")]] * 2),
    }
    for variant, (easy_texts, hard_texts) in runs.items():
        out = model_dir / variant / "eval"
        out.mkdir(parents=True)
        suites = {}
        for name, suite, texts in (("easy", easy, easy_texts), ("hard", hard, hard_texts)):
            gen = settings_for(suite, False, EvalSettings())
            scored = ScoredSuite(suite, rows, ["q"] * 2, [[1]] * 2, gen, reasoning=False)
            r = score_generation_suite(scored, outputs_by_seed(texts), 1.0, out / f"samples_{name}.jsonl")
            suites[name] = r | {"file": f"{name}.yaml", "n_available": 2, "metric": suite.metric}
        (out / "results.json").write_text(json.dumps(eval_results("m", variant, suites)))
    report = compare(model_dir, "bf16").model_dump(exclude_unset=True)
    assert report["suite_order"] == ["hard", "easy"]  # bf16 scores 0.5 on hard, 1.0 on easy
    cons = report["variants"]["int4"]["hard:cons_at_k"]
    assert (cons["mean"], cons["seeds"], cons["delta"], cons["recovery"]) == (0.0, 2, -0.5, 0.0)
    assert "easy:cons_at_k" not in report["variants"]["int4"]  # one sample: no vote to take
    assert report["variants"]["int4"]["hard:exact_match"]["recovery"] == 0.0
