"""Calibration sets are deterministic, hashed by their exact token ids, and read only through DATA_DIR."""

import json
import re

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")

from pipeline.checkpoint_files import sha256_file
from pipeline.data import word_problems
from pipeline.quantize import calibration_samples as calibration_module
from pipeline.quantize.calibration_samples import AnswersFrom, calibration_samples, calibration_texts, token_hash
from pipeline.schema import CalibSet, ConfigError


@pytest.fixture(scope="module")
def tokenizer(embedded_source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_source)


def synthetic(**kw) -> CalibSet:
    return CalibSet(
        **{"description": "t", "generator": "arithmetic-word-problems", "num_samples": 8, "max_seq_len": 256, **kw}
    )


def test_generated_problems_are_deterministic_and_correct():
    problems = word_problems(200, seed=3)
    assert problems == word_problems(200, seed=3)
    assert problems != word_problems(200, seed=4)
    for p in problems:
        final = int(p["answer"].split("#### ")[1])
        # the last worked step's result is the final answer, and every step's arithmetic holds
        steps = re.findall(r"([\d /*+-]+?) = \$?(\d+)", p["answer"])
        assert steps and int(steps[-1][1]) == final
        for expr, result in steps:
            assert eval(expr) == int(result), p


def test_samples_are_deterministic_and_the_hash_sees_every_token(tokenizer):
    a, origin = calibration_samples(synthetic(), tokenizer, None, "t")
    b, _ = calibration_samples(synthetic(), tokenizer, None, "t")
    assert origin == {"read_from": "generator:arithmetic-word-problems"}
    assert a == b and token_hash(a) == token_hash(b)
    assert len(a) == 8
    other, _ = calibration_samples(synthetic(seed=1), tokenizer, None, "t")
    assert token_hash(other) != token_hash(a)
    changed = [list(s) for s in a]
    changed[-1][-1] += 1
    assert token_hash(changed) != token_hash(a)


def test_chat_template_is_applied_and_length_capped(tokenizer):
    chat, _ = calibration_samples(synthetic(max_seq_len=32), tokenizer, None, "t")
    assert all(len(s) <= 32 for s in chat)
    text = tokenizer.decode(calibration_samples(synthetic(), tokenizer, None, "t")[0][0])
    assert text.startswith("<|im_start|>system") and "<|im_start|>assistant" in text and "####" in text
    plain = tokenizer.decode(calibration_samples(synthetic(chat_template=False), tokenizer, None, "t")[0][0])
    assert "<|im_start|>" not in plain and "####" in plain


def test_the_models_own_answers_follow_each_prompt_and_are_generated_once(tokenizer, tmp_path, monkeypatch):
    import subprocess

    calls = []

    def fake_vllm(module, model, prompts, out, *flags, wait):  # what pipeline.quantize.traces writes, without vLLM
        calls.append((module, model, flags))
        n = len(json.loads(open(prompts).read()))
        answers = {"output_ids": [[7, 8, 9]] * (n - 1) + [[5] * 400], "finish_reasons": ["stop"] * (n - 1) + ["length"]}
        answers["sampling"] = {"temperature": 0.0, "max_tokens": 400, "seed": 0}
        open(out, "w").write(json.dumps(answers))
        return subprocess.CompletedProcess([], 0, "", "")

    monkeypatch.setattr(calibration_module, "run_in_serve_env", fake_vllm)
    calib = synthetic(responses="model", max_new_tokens=400)
    where = AnswersFrom(tmp_path / "src", "ab" * 32, tmp_path / "cache")
    samples, origin = calibration_samples(calib, tokenizer, None, "t", where)
    assert len(calls) == 1 and calls[0][0] == "pipeline.quantize.traces" and "--max-tokens" in calls[0][2]
    prompt = tokenizer.decode(samples[0][:-3])
    assert prompt.rstrip().endswith("<|im_start|>assistant") and "####" not in prompt  # the data's answer is not used
    assert samples[0][-3:] == [7, 8, 9] and len(samples[-1]) == 256  # max_seq_len
    assert origin["responses"] == "model" and origin["answer_tokens"] == 7 * 3 + 400
    assert origin["answers_cut_at_max_new_tokens"] == 1 and origin["answers_file"].startswith(str(tmp_path / "cache"))
    again, _ = calibration_samples(calib, tokenizer, None, "t", where)
    assert again == samples and len(calls) == 1  # cached: no second generation
    other_source = where._replace(source_sha256="cd" * 32)
    calibration_samples(calib, tokenizer, None, "t", other_source)
    assert len(calls) == 2  # other weights, other answers


def test_model_answer_settings_are_checked():
    with pytest.raises(ValueError, match="response_field: unused with responses: model"):
        synthetic(responses="model", response_field="answer")
    with pytest.raises(ValueError, match="max_new_tokens: used only with responses: model"):
        synthetic(max_new_tokens=64)


def test_local_data_is_read_from_data_dir_and_sampled_by_seed(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(50)]
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calib = CalibSet(
        description="t", hub_id="openai/gsm8k", local_file="set/train.jsonl", num_samples=10, max_seq_len=64
    )
    picked, origin = calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    assert (picked, origin) == calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    assert len(set(picked)) == 10 and all(q.startswith("q") and a.startswith("a") for q, a in picked)
    # the manifest says which bytes were read, and from where; a local file has no hub split
    assert origin == {
        "read_from": "DATA_DIR/set/train.jsonl",
        "data_dir": str(tmp_path),
        "data_file_sha256": sha256_file(tmp_path / "set/train.jsonl"),
    }


def test_prompts_without_answers_serve_when_the_model_writes_them(tmp_path):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text("".join(json.dumps({"question": f"q{i}"}) + "\n" for i in range(9)))
    calib = CalibSet(description="t", local_file="set/train.jsonl", num_samples=4, max_seq_len=64, responses="model")
    picked, _ = calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    assert len(picked) == 4 and all(q.startswith("q") and a is None for q, a in picked)
    with pytest.raises(ConfigError, match="answer"):  # the data's answers are needed when they are the responses
        calibration_texts(calib.model_copy(update={"responses": "data"}), str(tmp_path), "calib/t.yaml")


@pytest.mark.parametrize(
    "calib, data_dir, expected",
    [
        (
            dict(local_file="missing/train.jsonl"),
            "DATA",
            "calib/t.yaml: {data}/missing/train.jsonl not found; point DATA_DIR at the folder",
        ),
        (
            dict(local_file="set/train.jsonl", num_samples=99),
            "DATA",
            "num_samples: 99 asked, {data}/set/train.jsonl has 3 rows",
        ),
        (
            dict(local_file="set/train.jsonl", prompt_field="problem"),
            "DATA",
            "{data}/set/train.jsonl: line 1: field 'problem' is missing",
        ),
        (dict(local_file="set/train.jsonl"), None, "has no hub_id; set DATA_DIR"),
    ],
)
def test_data_errors_are_one_line_and_name_the_setting(tmp_path, calib, data_dir, expected):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text('{"question": "q", "answer": "a"}\n' * 3)
    spec = CalibSet(**{"description": "t", "num_samples": 2, "max_seq_len": 64, **calib})
    with pytest.raises(ConfigError) as e:
        calibration_texts(spec, data_dir and str(tmp_path), "calib/t.yaml")
    assert expected.format(data=tmp_path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "lines, expected",
    [
        # the prompt field is missing in one row of many: named with its record, not a KeyError
        (
            ['{"question": "q", "answer": "a"}'] * 5 + ['{"answer": "a"}'],
            "{data}/set/train.jsonl: line 6: field 'question' is missing",
        ),
        (
            ['{"question": "q", "answer": "a"}', '{"question": ["q1", "q2"], "answer": "a"}'] * 3,
            "{data}/set/train.jsonl: line 2: field 'question' is a list, not text",
        ),
        (
            ['{"question": "q", "answer": null}'] * 6,
            "{data}/set/train.jsonl: line 1: field 'answer' is null, not text",
        ),
        (
            ['{"question": "q", "answer": "a"}', '{"question": "q", "answer": "a"', '{"question": "q", "answer": "a"}']
            * 2,
            "{data}/set/train.jsonl: line 2: not valid JSON",
        ),
        (
            ['{"question": "q", "answer": "a"}', '["q", "a"]'] * 3,
            "{data}/set/train.jsonl: line 2: expected a JSON object, got list",
        ),
    ],
)
def test_bad_rows_are_one_line_naming_file_and_row(tmp_path, lines, expected):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text("\n".join(lines) + "\n")
    spec = CalibSet(description="t", local_file="set/train.jsonl", num_samples=2, max_seq_len=64)
    with pytest.raises(ConfigError) as e:
        calibration_texts(spec, str(tmp_path), "calib/t.yaml")
    assert expected.format(data=tmp_path) in str(e.value) and "\n" not in str(e.value)
