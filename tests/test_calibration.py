"""Calibration sets are deterministic, hashed by their exact token ids, and read only through DATA_DIR."""
import json
import re

import pytest

from pipeline.data import word_problems
from pipeline.quantize import calibration_samples, calibration_texts, token_hash
from pipeline.schema import CalibSet, ConfigError


@pytest.fixture(scope="module")
def tokenizer(embedded_source):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(embedded_source)


def synthetic(**kw) -> CalibSet:
    return CalibSet(**{"description": "t", "generator": "arithmetic-word-problems", "num_samples": 8,
                       "max_seq_len": 256, **kw})


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
    a = calibration_samples(synthetic(), tokenizer, None, "t")
    b = calibration_samples(synthetic(), tokenizer, None, "t")
    assert a == b and token_hash(a) == token_hash(b)
    assert len(a) == 8
    other = calibration_samples(synthetic(seed=1), tokenizer, None, "t")
    assert token_hash(other) != token_hash(a)
    changed = [list(s) for s in a]
    changed[-1][-1] += 1
    assert token_hash(changed) != token_hash(a)


def test_chat_template_is_applied_and_length_capped(tokenizer):
    chat = calibration_samples(synthetic(max_seq_len=32), tokenizer, None, "t")
    assert all(len(s) <= 32 for s in chat)
    text = tokenizer.decode(calibration_samples(synthetic(), tokenizer, None, "t")[0])
    assert text.startswith("<|im_start|>system") and "<|im_start|>assistant" in text and "####" in text
    plain = tokenizer.decode(calibration_samples(synthetic(chat_template=False), tokenizer, None, "t")[0])
    assert "<|im_start|>" not in plain and "####" in plain


def test_local_data_is_read_from_data_dir_and_sampled_by_seed(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(50)]
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calib = CalibSet(description="t", hub_id="openai/gsm8k", local_file="set/train.jsonl", num_samples=10, max_seq_len=64)
    picked = calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    assert picked == calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    assert len(set(picked)) == 10 and all(q.startswith("q") and a.startswith("a") for q, a in picked)


@pytest.mark.parametrize("calib, data_dir, expected", [
    (dict(local_file="missing/train.jsonl"), "DATA", "calib/t.yaml: {data}/missing/train.jsonl not found; point DATA_DIR at the folder"),
    (dict(local_file="set/train.jsonl", num_samples=99), "DATA", "num_samples: 99 asked, the data has 3 rows"),
    (dict(local_file="set/train.jsonl", prompt_field="problem"), "DATA", "field 'problem' is not in the data"),
    (dict(local_file="set/train.jsonl"), None, "has no hub_id; set DATA_DIR"),
])
def test_data_errors_are_one_line_and_name_the_setting(tmp_path, calib, data_dir, expected):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.jsonl").write_text('{"question": "q", "answer": "a"}\n' * 3)
    spec = CalibSet(**{"description": "t", "num_samples": 2, "max_seq_len": 64, **calib})
    with pytest.raises(ConfigError) as e:
        calibration_texts(spec, data_dir and str(tmp_path), "calib/t.yaml")
    assert expected.format(data=tmp_path) in str(e.value) and "\n" not in str(e.value)
