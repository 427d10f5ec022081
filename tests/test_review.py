"""make review's data side, without a browser or a server: which items disagree and in what order, what
the page says for a folder the stages have not filled, and the defaults it takes from report and serve.yaml.
The page itself, served and driven in headless Chromium, is tested after the CPU chain (test_chain.py)."""

import json

import pytest

from pipeline.review.__main__ import default_max_model_len, main
from pipeline.review.access import check_model_dir
from pipeline.review.chat import ChatServer, chat_pair, sampling_defaults
from pipeline.review.disagreements import TRUNCATION, counts, disagreements, keep
from pipeline.review.render import folded, render_items
from pipeline.review.report_tab import report_markdown
from pipeline.schema import ConfigError, Decision

from stage_files import eval_results, samples_file, variant_manifest


def two_variants(tmp_path, variant_records, suite="math"):
    """bf16 right on items 0-2 and wrong on 3; the variant's records as given."""
    model_dir = tmp_path / "tiny"
    base = [{"doc_id": i, "output": "4", "exact_match": float(i < 3)} for i in range(4)]
    for name, records in (("bf16", base), ("int4", variant_records)):
        (model_dir / name).mkdir(parents=True)
        (model_dir / name / "manifest.json").write_text(json.dumps(variant_manifest("tiny", name)))
        samples_file(model_dir / name / "eval" / f"samples_{suite}.jsonl", records)
        (model_dir / name / "eval/results.json").write_text(json.dumps(eval_results("tiny", name, {})))
    return model_dir


def test_disagreements_put_the_baselines_wins_first_and_count_every_kind(tmp_path):
    variant = [
        {"doc_id": 0, "output": "4", "exact_match": 1.0},  # same: not shown
        {"doc_id": 1, "output": "5", "exact_match": 0.0, "truncated": True, "finish_reason": "length"},
        {"doc_id": 2, "output": "7", "exact_match": 0.0},
        {"doc_id": 3, "output": "4", "exact_match": 1.0},  # the variant's win
    ]
    model_dir = two_variants(tmp_path, variant)
    found, total = disagreements(model_dir, "math", "int4", "exact_match")
    assert [d.doc_id for d in found] == [1, 2, 3]
    assert counts(found, total) == {"items": 4, "differ": 3, "baseline_better": 2, "variant_better": 1, "cut_off": 1}
    assert [d.doc_id for d in found if keep(d, TRUNCATION[1])] == [1]
    assert [d.doc_id for d in found if keep(d, TRUNCATION[2])] == [2, 3]
    page = render_items(found, ("bf16", "int4"), "exact_match", (False, False))
    assert page.count('class="item"') == 3 and "cut off" in page


def test_scores_are_averaged_over_seeds_and_the_first_seeds_output_shown(tmp_path):
    variant = [
        {"doc_id": i, "seed": seed, "output": f"seed {seed}", "exact_match": float(i < 3 and seed == 0)}
        for i in range(4)
        for seed in (1, 0)  # written out of order: the first seed is 0 all the same
    ]
    found, _ = disagreements(two_variants(tmp_path, variant), "math", "int4", "exact_match")
    assert [(d.doc_id, d.variant.score, d.variant.seeds, d.variant.output) for d in found] == [
        (0, 0.5, 2, "seed 0"),
        (1, 0.5, 2, "seed 0"),
        (2, 0.5, 2, "seed 0"),
    ]


def test_mismatched_items_and_a_missing_figure_are_one_line_errors(tmp_path):
    model_dir = two_variants(tmp_path, [{"doc_id": 0, "output": "4", "exact_match": 1.0}])
    with pytest.raises(ConfigError, match="not the same items.*LIMIT"):
        disagreements(model_dir, "math", "int4", "exact_match")
    with pytest.raises(ConfigError, match="samples_squad.jsonl: missing; run `make eval`"):
        disagreements(model_dir, "squad", "int4", "exact_match")
    with pytest.raises(ConfigError, match="no 'f1' figure"):
        disagreements(model_dir, "math", "int4", "f1")


def test_think_blocks_are_folded_and_text_is_escaped():
    html = folded("let me see <b>\n</think>\nThe answer is 4.", reasoning=True)
    assert html.startswith("<details><summary>think block (4 words)") and "&lt;b&gt;" in html
    assert html.endswith("<pre>The answer is 4.</pre>")
    assert "never closed" in folded("still thinking", reasoning=True) and "no answer" in folded("x", True)
    assert folded("plain <i>", reasoning=False) == "<pre>plain &lt;i&gt;</pre>"


def test_a_folder_without_report_or_variants_gets_a_message_not_a_traceback(tmp_path):
    text, plots = report_markdown(tmp_path)
    assert text.startswith("**No report to show.**") and "run `make report` first" in text and plots == []
    with pytest.raises(ConfigError, match="no such folder"):
        check_model_dir(tmp_path / "nothing")
    with pytest.raises(ConfigError, match=r"no variants \(\*/manifest.json\); run `make quantize`"):
        check_model_dir(tmp_path)
    assert main([str(tmp_path / "nothing")]) == 2  # before any server starts


def test_the_chat_pair_is_bf16_and_the_choice_else_the_closest(tmp_path):
    model_dir = two_variants(tmp_path, [])
    chosen = Decision(chosen="int4", closest=None, verdicts={}, summary="")
    assert chat_pair(model_dir, chosen, "bf16") == ["bf16", "int4"]
    closest = Decision(chosen="bf16", closest="awq", verdicts={}, summary="")
    assert chat_pair(model_dir, closest, "bf16") == ["bf16", "awq"]
    assert chat_pair(model_dir, None, "bf16") == ["bf16", "int4"]  # no report: the other variant there


def test_sampling_and_context_come_from_the_published_serve_yaml(tmp_path):
    model_dir = two_variants(tmp_path, [])
    side = ChatServer("bf16", model_dir / "bf16", tmp_path, 2048, {})
    (model_dir / "bf16/generation_config.json").write_text(json.dumps({"temperature": 0.7, "do_sample": True}))
    assert sampling_defaults(model_dir, [side]) == (
        {"temperature": 0.7},
        str(model_dir / "bf16/generation_config.json"),
    )
    (model_dir / "bf16/config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert default_max_model_len(model_dir, ["bf16"]) == 2048
    published = tmp_path / "published/tiny-int4"
    published.mkdir(parents=True)
    (published / "serve.yaml").write_text(
        "max-model-len: 1024\noverride-generation-config: {temperature: 0.6, top_p: 0.95}\n"
    )
    assert sampling_defaults(model_dir, [side]) == ({"temperature": 0.6, "top_p": 0.95}, str(published / "serve.yaml"))
    assert default_max_model_len(model_dir, ["bf16"]) == 1024


def test_the_page_builds_for_a_folder_without_eval_results(tmp_path):
    pytest.importorskip("gradio")
    from pipeline.review.page import build_page

    model_dir = tmp_path / "tiny"
    (model_dir / "bf16").mkdir(parents=True)
    side = ChatServer("bf16", model_dir / "bf16", tmp_path, 1024, {})
    page = build_page(model_dir, "bf16", [side, side], ({}, "vLLM's defaults"))
    config = json.dumps(page.get_config_file())
    assert "Nothing to compare." in config and "No report to show." in config


class CountingTokenizer:
    """A chat template that is one token per word, plus two."""

    def apply_chat_template(self, messages, **kwargs):
        return [0] * (len(messages[0]["content"].split()) + 2)


def test_chat_refuses_an_empty_prompt_a_too_long_one_and_says_which_variant_failed(tmp_path):
    from pipeline.review.chat import chat_turn

    missing = ChatServer("int4", tmp_path / "int4", tmp_path, 16, {})
    missing._serve(None)  # no config.json there: it fails before any server starts
    assert missing.error.endswith("no checkpoint (config.json); run `make quantize` for int4")
    assert missing.status().startswith("**int4** failed to start: ")
    ready = ChatServer("bf16", tmp_path / "bf16", tmp_path, 16, {})
    ready.tokenizer, ready.startup_s = CountingTokenizer(), 1.0
    ready.ready.set()
    sides = [ready, missing]

    *_, last = chat_turn(sides, {}, "   ", 8)
    assert "the prompt is empty" in last[1] and "the prompt is empty" in last[4]
    *_, last = chat_turn(sides, {}, " ".join(["word"] * 20), 8)  # 22 tokens with the template, 16 allowed
    assert "the prompt is 22 tokens with the chat template; this server takes at most 16" in last[1]
    assert last[3].startswith("**int4** failed to start") and last[4] == ""  # nothing sent to a dead variant
