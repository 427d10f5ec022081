"""Every wait is bounded: a server that takes requests and never answers them, or one that never becomes
healthy, is given up on after the bound its work allows (openai_client.Pace, serving.start_wait), in one line
that says what was waited for, how long, and what to do. Against a real server on 127.0.0.1 that accepts
and never answers, stopped after each test. Runs where aiohttp is (the eval client's): .venv-serve."""

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.openai_client import CompletionsClient, Pace, Request, ServerError
from pipeline.schema import ConfigError
from pipeline.serving import START_ALLOWANCE_S, Server, Wait, free_port, start_wait
from pipeline.settings import ROOT

pytest.importorskip("aiohttp")

# Small enough for a test to wait out, with the shape of the real ones (pipeline/openai_client.py)
TEST_PACE = Pace(first_token_s=1.0, request_tok_s=20.0, server_tok_s=40.0)
SLACK_S = 2.0  # a loaded 2-core machine's scheduling, on top of a bound


@pytest.fixture()
def silent_server():
    """An OpenAI-shaped server that lists one model (GET /v1/models) but never answers a completion: it
    reads the request and holds the connection open, as a server whose engine hangs does."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "m", "root": "m", "max_model_len": 4096}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            stop.wait()  # accepted, never answered

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    stop.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


def outcome_within(seconds: float, work) -> tuple[BaseException | None, float]:
    """(what `work` raised, its wall time); fails the test, instead of hanging it, where it is still waiting
    after `seconds`."""
    done: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            work()
        except BaseException as e:  # handed back to the test
            done["error"] = e
        done["wall"] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds:.0f} s: the wait has no bound"
    return done.get("error"), done["wall"]


def test_a_request_to_a_server_that_never_answers_ends_at_its_bound(silent_server):
    requests = [Request([1, 2, 3], max_tokens=17)] * 2  # 2 in flight: 20 tok/s each, 1 + 20 / 20 = 2 s
    client = CompletionsClient(silent_server, "key", "m", concurrency=4, pace=TEST_PACE)
    assert TEST_PACE.bound_s(requests[0], 2) == pytest.approx(2.0)
    error, wall = outcome_within(2.0 + SLACK_S + 5, lambda: client.complete(requests))
    assert isinstance(error, ServerError) and 2.0 <= wall <= 2.0 + SLACK_S, (error, wall)
    assert str(error) == (
        f"{silent_server}/v1/completions: no answer to a request in 2 s, its bound (1 s to a first token + 3 prompt "
        "and 17 new tokens at 20 tok/s, 2 requests in flight); the server takes requests but does not answer "
        "them: look at its log and load, or send fewer at once"
    )


def test_a_requests_bound_grows_with_its_work_and_with_what_shares_the_server():
    short, long = Request([0] * 10, max_tokens=10), Request([0] * 10, max_tokens=1000)
    assert TEST_PACE.bound_s(long, 1) > TEST_PACE.bound_s(short, 1)
    # alone: the request's own floor; 8 in flight share the server's 40 tok/s, 5 tok/s each
    assert TEST_PACE.bound_s(short, 1) == pytest.approx(1 + 20 / 20)
    assert TEST_PACE.bound_s(short, 8) == pytest.approx(1 + 20 / 5)


def test_make_eval_on_an_endpoint_that_never_answers_ends_in_one_line(
    silent_server, embedded_source, tmp_path, monkeypatch
):
    """Issue 42: make eval ENDPOINT=... against a server that accepts and never answers held the stage
    silent for up to an hour a request (the client's read timeout was 3,600 s)."""
    import pipeline.evaluate.on_endpoint as on_endpoint

    for key in ("ENDPOINT_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(on_endpoint, "ENDPOINT_PACE", TEST_PACE)
    settings = dict(data_dir=None, limit=2, seeds=None, greedy=True, reasoning_flag="no", max_tokens=8, samples=None)
    model_dir = tmp_path / "artifacts/tiny"
    suites = [ROOT / "eval/synthetic-rc.yaml"]
    url = f"{silent_server}/v1"

    def run():
        on_endpoint.evaluate_endpoint(model_dir, str(embedded_source), suites, url, None, None, 4, **settings)

    error, wall = outcome_within(120, run)
    assert isinstance(error, ConfigError), error
    line = str(error)
    assert "\n" not in line and line.startswith(f"ENDPOINT={url}: {silent_server}/v1/completions: no answer")
    assert line.endswith("or send fewer at once; nothing was written")
    bound = float(re.search(r"no answer to a request in (\d+) s", line).group(1))
    assert "2 requests in flight" in line and wall <= bound + 30 + SLACK_S  # the plan (tokenizer) is the 30 s
    assert not list(tmp_path.rglob("*endpoint-*"))  # nothing written, not even half


def test_a_server_that_never_becomes_healthy_is_given_up_on_at_its_bound(tmp_path):
    log = tmp_path / "server.log"
    never_healthy = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(120)"]
    server = Server(never_healthy, free_port(), log, Wait(2, "2 s for the test"))

    def start():
        with server:
            server.wait_healthy()

    error, wall = outcome_within(2 + SLACK_S + 10, start)
    assert isinstance(error, RuntimeError) and 2 <= wall <= 2 + SLACK_S + 3, (error, wall)  # + stopping it
    assert str(error) == f"server not healthy after 2 s, its bound (2 s for the test): loading; see {log}"


def test_a_servers_start_bound_grows_with_its_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 5_000_000)
    wait = start_wait(tmp_path)
    assert wait.seconds == pytest.approx(START_ALLOWANCE_S + 0.1)  # 5 MB at 50 MB/s
    assert wait.why == f"{START_ALLOWANCE_S} s to start + 0.01 GB of weights at 50 MB/s"
