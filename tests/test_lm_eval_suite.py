"""lm-eval tasks as suites (pipeline/evaluate/lm_eval_suite.py): the one-line errors before any server starts,
and a task run end to end through lm-eval against a real vLLM server of the tiny model, its
per-item records equal to lm-eval's own aggregate."""

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is in the serve lock; this environment lacks it")

from pipeline.artifacts import read_samples  # noqa: E402
from pipeline.evaluate import lm_eval_suite  # noqa: E402
from pipeline.schema import ConfigError, is_lm_eval_suite  # noqa: E402
from pipeline.settings import ROOT  # noqa: E402

ROWS = [
    {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": "What is 7 - 4?", "answer": "7 - 4 = 3\n#### 3"},
    {"question": "What is 6 * 2?", "answer": "6 * 2 = 12\n#### 12"},
    {"question": "What is 9 / 3?", "answer": "9 / 3 = 3\n#### 3"},
]


def task_yaml(data_file: str, name: str = "arith_local", target: str = "{{answer}}") -> str:
    """A zero-shot generate_until task over local JSON Lines, scored by exact match on the whole output."""
    return f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_file}
output_type: generate_until
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{target}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["Question:"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 8
"""


def write_suite(folder: Path, data_file: str, **task) -> Path:
    (folder / "tasks").mkdir(exist_ok=True)
    (folder / "tasks/arith.yaml").write_text(task_yaml(data_file, **task))
    suite = folder / "lmeval-arith.yaml"
    suite.write_text("kind: lm-eval\ndescription: arithmetic\ntask_file: tasks/arith.yaml\napi: completions\n")
    return suite


@pytest.fixture
def data_dir(tmp_path) -> Path:
    (tmp_path / "data/arith").mkdir(parents=True)
    (tmp_path / "data/arith/test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path / "data"


# ------------------------------------------------------------------------------ one-line errors
def test_shipped_suite_is_an_lm_eval_suite_and_resolves_under_data_dir(tmp_path):
    path = ROOT / "eval/lmeval-gsm8k-local.yaml"
    assert is_lm_eval_suite(path) and not is_lm_eval_suite(ROOT / "eval/gsm8k.yaml")
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    task = lm_eval_suite.prepare(path, str(tmp_path))
    assert task.task_name == "gsm8k_local" and task.name == "lmeval-gsm8k-local"
    assert task.spec["dataset_kwargs"]["data_files"] == {"test": str(data / "test.jsonl")}


def test_missing_data_file_is_one_line(tmp_path):
    suite = write_suite(tmp_path, "arith/test.jsonl")
    with pytest.raises(ConfigError, match=r"arith/test.jsonl does not exist; check DATA_DIR") as e:
        lm_eval_suite.prepare(suite, str(tmp_path / "nowhere"))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"under DATA_DIR; set DATA_DIR"):
        lm_eval_suite.prepare(suite, None)


def test_task_and_task_file_are_exclusive(tmp_path):
    suite = tmp_path / "lmeval-x.yaml"
    suite.write_text("kind: lm-eval\ndescription: x\ntask: gsm8k\ntask_file: t.yaml\n")
    with pytest.raises(ConfigError, match=r"lmeval-x.yaml: task: give either task"):
        lm_eval_suite.prepare(suite, None)
    suite.write_text("kind: lm-eval\ndescription: x\ntask_file: absent.yaml\n")
    with pytest.raises(ConfigError, match=r"absent.yaml does not exist"):
        lm_eval_suite.prepare(suite, None)


def test_unknown_task_and_hub_task_offline_are_one_line(tmp_path, monkeypatch):
    suite = tmp_path / "lmeval-x.yaml"
    suite.write_text("kind: lm-eval\ndescription: x\ntask: gsm8k_nonexistent_task\n")
    with pytest.raises(ConfigError, match=r"lm-eval has no task 'gsm8k_nonexistent_task'") as e:
        lm_eval_suite.prepare(suite, None)
    assert "\n" not in str(e.value)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    suite.write_text("kind: lm-eval\ndescription: x\ntask: gsm8k\n")
    with pytest.raises(ConfigError, match=r"reads openai/gsm8k from the Hugging Face Hub, and HF_DATASETS_OFFLINE"):
        lm_eval_suite.prepare(suite, None)


def test_logged_samples_become_records_of_lm_evals_aggregate(tmp_path, data_dir, monkeypatch):
    """lm-eval's own DummyLM (it answers "lol") through simple_evaluate: its logged samples as the
    project's records, checked against its aggregate, and its results entries under the suite's name.
    The end-to-end test below does the same through a real model and server."""
    import lm_eval
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # DummyLM names a hub tokenizer it does not need here
    task = lm_eval_suite.prepare(write_suite(tmp_path, "arith/test.jsonl"), str(data_dir))
    output = lm_eval.simple_evaluate(
        model="dummy", tasks=[task.spec], task_manager=task.task_manager, log_samples=True, bootstrap_iters=0
    )
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "artifacts/sources/smollm2-135m-instruct")
    entry = lm_eval_suite.write_records(task, output, tokenizer, False, tmp_path, 1.0, "dummy")
    records = read_samples(tmp_path / "samples_lmeval-arith.jsonl")
    assert [(r.doc_id, r.output, r.exact_match, r.gold) for r in records] == [
        (i, "lol", 0.0, row["answer"]) for i, row in enumerate(ROWS)
    ]
    assert records[0].prompt == "Question: What is 2 + 3?\nAnswer:" and not records[0].truncated
    assert entry["n"] == 4 and entry["metrics"]["exact_match"]["mean"] == 0.0 and entry["no_answer"] == 0
    doc = {k: {} for k in ("results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better")}
    doc["n-samples"] = {}
    lm_eval_suite.add_to_results_json(doc, {"lmeval-arith": output})
    assert json.loads(json.dumps(doc))["results"]["lmeval-arith"]["exact_match,none"] == 0.0
    assert doc["n-samples"]["lmeval-arith"] == {"original": 4, "effective": 4}


def test_an_output_of_exactly_max_gen_toks_tokens_is_counted_truncated(tmp_path, data_dir):
    """lm-eval logs no finish reason: an output that used every token the task allows (max_gen_toks, 8
    here) was cut off, one token fewer was not."""
    from transformers import AutoTokenizer

    task = lm_eval_suite.prepare(write_suite(tmp_path, "arith/test.jsonl"), str(data_dir))
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "artifacts/sources/smollm2-135m-instruct")
    outputs = {n: " five" * n for n in (7, 8, 9)}
    assert {n: len(tokenizer(o, add_special_tokens=False)["input_ids"]) for n, o in outputs.items()} == {
        n: n for n in outputs
    }
    samples = [
        {
            "doc_id": i,
            "filter": "none",
            "arguments": [("Question: What is 2 + 3?\nAnswer:", {"until": ["Question:"], "max_gen_toks": 8})],
            "resps": [[output]],
            "filtered_resps": [output],
            "target": "5",
            "exact_match": 0.0,
            "metrics": ["exact_match"],
        }
        for i, output in enumerate(outputs.values())
    ]
    records = lm_eval_suite.to_records(task, samples, tokenizer, chat=False)
    assert [(r["output_tokens"], r["truncated"]) for r in records] == [(7, False), (8, True), (9, True)]
    assert lm_eval_suite.summary(task, records, 1.0)["truncated"] == 2


def test_a_chat_request_as_lm_eval_logs_it_gives_the_messages_and_their_templated_length():
    """local-chat-completions logs each context as its JsonChatStr, a one-field NamedTuple, which the logged
    samples hold as a plain tuple: the record's prompt is the messages' JSON, its length the templated one."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    arguments = [((json.dumps(messages),), {"until": ["Question:"], "max_gen_toks": 8})]
    text = lm_eval_suite.prompt_text(arguments, chat=True)
    assert json.loads(text) == messages
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "artifacts/sources/smollm2-135m-instruct")
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert lm_eval_suite.prompt_length(text, tokenizer, chat=True) == len(
        tokenizer(templated, add_special_tokens=False)["input_ids"]
    )


# ------------------------------------------------------------------------------------ end to end
@pytest.mark.e2e  # starts vLLM: minutes, not seconds
def test_task_through_the_server_records_equal_lm_evals_aggregate(tiny_model, data_dir, tmp_path):
    """Run 1 scores the tiny model's greedy outputs against the data's answers; run 2, on the same
    server, against targets that are run 1's outputs for the first two items: lm-eval's exact_match
    then scores 1, 1, 0, 0 (greedy is deterministic), and the records must average to its figure."""
    suite = write_suite(tmp_path, "arith/test.jsonl")
    task = lm_eval_suite.prepare(suite, str(data_dir))
    out1, out2 = tmp_path / "run1", tmp_path / "run2"
    out1.mkdir(), out2.mkdir()
    with lm_eval_suite.server_for(tiny_model, task.suite, tmp_path / "server.log") as server:
        server.wait_healthy()
        entry, output = lm_eval_suite.run_on_server(task, tiny_model, server, out1, None)
        first = read_samples(out1 / "samples_lmeval-arith.jsonl")
        assert [r.doc_id for r in first] == [0, 1, 2, 3] and all(r.output_tokens <= 8 for r in first)
        assert entry["n"] == 4 and entry["n_available"] == 4 and entry["metric"] == "lm-eval"
        rows = [r | {"target": first[i].output if i < 2 else "not what it wrote"} for i, r in enumerate(ROWS)]
        (data_dir / "arith/test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / "tasks/arith.yaml").write_text(task_yaml("arith/test.jsonl", target="{{target}}"))
        task = lm_eval_suite.prepare(suite, str(data_dir))
        entry, output = lm_eval_suite.run_on_server(task, tiny_model, server, out2, None)
    records = read_samples(out2 / "samples_lmeval-arith.jsonl")
    assert [r.output for r in records] == [r.output for r in first]  # greedy, same server
    assert [r.exact_match for r in records] == [1.0, 1.0, 0.0, 0.0]
    aggregate = output["results"]["arith_local"]["exact_match,none"]
    assert aggregate == pytest.approx(0.5) == entry["metrics"]["exact_match"]["mean"]
    assert sum(r.exact_match for r in records) / len(records) == pytest.approx(aggregate)
    assert entry["metrics"]["exact_match"]["ci95"][0] <= 0.5 <= entry["metrics"]["exact_match"]["ci95"][1]
