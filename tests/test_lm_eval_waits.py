"""An lm-eval suite's requests wait as long as their work needs, not lm-eval's own 300 s, and a server that
takes them and never answers is one line naming what was waited for (issue 42; lm_eval_suite.request_bound).
Against a real listener on 127.0.0.1 that accepts every connection and never answers."""

import json
import math
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is in the serve lock; this environment lacks it")

from pipeline.evaluate import lm_eval_suite  # noqa: E402
from pipeline.openai_client import CPU_PACE, GPU_PACE, Pace, ServerError  # noqa: E402
from pipeline.settings import ROOT  # noqa: E402

SOURCE = ROOT / "artifacts/sources/smollm2-135m-instruct"
TASK = """task: arith_wait
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["Question:"]
  max_gen_toks: 8
"""


def server_like(port: int, max_len: int, log: Path) -> SimpleNamespace:
    """What lm_eval_suite reads of a serving.Server: its port, key, command and log."""
    return SimpleNamespace(port=port, api_key="k", cmd=["vllm", "--max-model-len", str(max_len)], log_path=log)


def test_the_bound_is_the_largest_request_the_server_takes_at_the_device_pace(monkeypatch):
    monkeypatch.setattr(lm_eval_suite, "on_gpu", lambda: False)
    bound, why = lm_eval_suite.request_bound(server_like(1, 4096, Path("log")))
    assert bound == 60 + 4096 / CPU_PACE.rate(8) == 8252
    assert why == (
        "60 s to a first token + up to 4096 prompt and new tokens (the server's max_model_len) at 0.5 tok/s, "
        "8 requests in flight"
    )
    monkeypatch.setattr(lm_eval_suite, "on_gpu", lambda: True)
    assert lm_eval_suite.request_bound(server_like(1, 2048, Path("log")))[0] == math.ceil(60 + 2048 / GPU_PACE.rate(8))
    # whole seconds, up: lm-eval takes int(timeout), which would cut 1.5 s to 1
    monkeypatch.setattr(lm_eval_suite, "GPU_PACE", Pace(first_token_s=1, request_tok_s=100, server_tok_s=800))
    assert lm_eval_suite.request_bound(server_like(1, 50, Path("log")))[0] == 2
    args = lm_eval_suite.model_args(None, SOURCE, server_like(1, 50, Path("log")), chat=False, reasoning=False)
    assert args["timeout"] == 2 and args["num_concurrent"] == 8


def test_a_server_that_never_answers_is_one_line_within_the_bound(tmp_path, monkeypatch):
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5"}) + "\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/arith.yaml").write_text(TASK.format(data=tmp_path / "data.jsonl"))
    suite = tmp_path / "lmeval-wait.yaml"
    suite.write_text("kind: lm-eval\ndescription: a wait\ntask_file: tasks/arith.yaml\napi: completions\n")
    task = lm_eval_suite.prepare(suite, None)

    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])  # taken, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(lm_eval_suite, "on_gpu", lambda: False)
    monkeypatch.setattr(lm_eval_suite, "CPU_PACE", Pace(first_token_s=2, request_tok_s=100, server_tok_s=800))
    server = server_like(listener.getsockname()[1], 100, tmp_path / "server.log")
    result = {}

    def evaluate():
        t0 = time.time()
        try:
            lm_eval_suite.run_on_server(task, SOURCE, server, tmp_path, None)
        except BaseException as e:  # noqa: BLE001 - what it ended with is the test's
            result["error"] = e
        result["s"] = time.time() - t0

    worker = threading.Thread(target=evaluate, daemon=True)
    worker.start()
    worker.join(timeout=120)  # lm-eval's own bound would be 300 s
    for c in held:
        c.close()
    listener.close()
    assert not worker.is_alive(), "still waiting after 120 s: lm-eval's own 300 s bound, not the work's"
    error = result["error"]
    assert isinstance(error, ServerError), repr(error)
    url = f"http://127.0.0.1:{server.port}/v1/completions"
    assert str(error) == (
        f"{url}: no answer to a request of lm-eval suite lmeval-wait in 3 s, its bound (2 s to a first token + up "
        "to 100 prompt and new tokens (the server's max_model_len) at 100 tok/s, 8 requests in flight); the server "
        f"takes requests but does not answer them: look at its log, {tmp_path / 'server.log'}"
    )
    assert 3 <= result["s"] < 60, result["s"]
    assert not (tmp_path / "samples_lmeval-wait.jsonl").exists()


def test_the_bound_takes_the_pace_of_every_request_in_flight(monkeypatch):
    """Eight requests share the server's steps: where the server's rate over eight is below one request's own,
    each gets an eighth of it (mutation audit: the pace of one request alone passed every test)."""
    monkeypatch.setattr(lm_eval_suite, "on_gpu", lambda: False)
    monkeypatch.setattr(lm_eval_suite, "CPU_PACE", Pace(first_token_s=1, request_tok_s=100, server_tok_s=400))
    bound, why = lm_eval_suite.request_bound(server_like(1, 100, Path("log")))
    assert bound == 1 + 100 / 50 == 3 and why.endswith("at 50 tok/s, 8 requests in flight")
