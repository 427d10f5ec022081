"""Every wait is bounded: a server that takes requests and never answers them, or one that never becomes
healthy, is given up on after the bound its work allows (openai_client.Pace, serving.start_wait), in one line
that says what was waited for, how long, and what to do. Against a real server on 127.0.0.1 that accepts
and never answers, stopped after each test. Runs where aiohttp is (the eval client's): .venv-serve."""

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from pipeline.evaluate.options import EvalSettings
from pipeline.openai_client import CompletionsClient, Pace, Request, ServerError
from pipeline.schema import ConfigError
from pipeline.serving import START_ALLOWANCE_S, Server, Wait, free_port, start_wait
from pipeline.settings import ROOT

from local_http import local_http_server

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

    with local_http_server(Handler) as url:
        yield url
        stop.set()  # the handlers still waiting: answered nothing, they end


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
    settings = EvalSettings([ROOT / "eval/synthetic-rc.yaml"], limit=2, greedy=True, reasoning_flag="no", max_tokens=8)
    model_dir = tmp_path / "artifacts/tiny"
    url = f"{silent_server}/v1"

    def run():
        on_endpoint.evaluate_endpoint(model_dir, str(embedded_source), on_endpoint.Endpoint(url, 4), settings)

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


def test_a_bench_levels_bound_counts_its_warm_up_rounds_beside_its_prompts():
    """A level's first run warms up with as many requests as it runs at once (measure_levels): their rounds
    are waited for too, or a slow warm-up of a large batch would read as a server that does not answer."""
    from pipeline.bench.levels import LevelRun
    from pipeline.schema import Shape

    shape = Shape(name="chat", input_len=8, output_len=8)
    one_round = 1 + 16 / 20  # a first token, then 16 tokens at 20 tok/s a request (2 at once: within 40 tok/s)
    wait = LevelRun(shape, concurrency=2, num_prompts=4, warmups=3).wait(TEST_PACE)
    assert wait.seconds == pytest.approx(one_round + (2 + 2) * one_round)  # ready check, 2 warm-up + 2 rounds
    assert wait.why.startswith("a ready check, then 4 x up to 2 requests at once")


def test_a_bench_level_against_a_server_that_never_answers_ends_at_its_bound(silent_server, embedded_source, tmp_path):
    """Issue 42: vLLM's benchmark client waits six hours a request (aiohttp's total timeout); a latency level
    on a server that took its requests and never answered held make bench that long."""
    pytest.importorskip("vllm.benchmarks.serve")
    from pipeline.bench.levels import LevelRun, run_serve_benchmark
    from pipeline.schema import Shape

    shape = Shape(name="chat", input_len=8, output_len=8)
    level = LevelRun(shape, concurrency=2, num_prompts=2)
    wait = level.wait(TEST_PACE)  # a ready check alone, then one round of 2: 1.8 s + 1.8 s
    assert wait.seconds == pytest.approx(2 * (1 + 16 / 20))
    port = int(silent_server.rsplit(":", 1)[1])
    log = tmp_path / "client.log"

    def run():
        run_serve_benchmark(embedded_source, port, "key", level, log, pace=TEST_PACE)

    error, wall = outcome_within(wait.seconds + SLACK_S + 30, run)
    assert isinstance(error, RuntimeError) and wait.seconds <= wall <= wait.seconds + SLACK_S + 5, (error, wall)
    assert str(error) == (
        "vLLM's serving benchmark at chat, concurrency 2: no result in 4 s, its bound (a ready check, then 1 x up "
        "to 2 requests at once; each 1 s to a first token + 8 prompt and 8 new tokens at 20 tok/s, 2 requests "
        f"in flight); the server takes requests but does not answer them: see its log and {log}"
    )


def test_a_load_test_whose_warm_up_gets_no_answer_fails_in_one_line_on_any_device(
    silent_server, tiny_model, tmp_path, monkeypatch
):
    """verify-published's load test ran its warm-up, ignored that nothing came back, and on another device
    class than bench's reported the sustained point that timed out as 'reported, not judged': it passed."""
    pytest.importorskip("vllm.benchmarks.serve")
    import shutil

    from test_capacity import capacity_section

    import pipeline.publish.load_test as load_test
    from pipeline.load.steady import PointPlan
    from pipeline.publish.serve_yaml import measured_capacity
    from pipeline.schema import Bench, Deployment

    from stage_files import bench_record

    settings = {"max-model-len": 256, "max-num-seqs": 4, "gpu-memory-utilization": 0.9}
    bench = Bench.model_validate(bench_record("tiny", "bf16", [], {}, capacity=capacity_section(2.0, settings)))
    folder = tmp_path / "tiny-bf16"  # measured on "Test CPU": another device class than this one
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("*.safetensors", "manifest.json"))
    stated = load_test.stated_capacity(measured_capacity(bench, Deployment(), tiny_model))
    (folder / "manifest.json").write_text(json.dumps({"stated_capacity": stated}))
    # a warm-up's own bound is 60 s + 10 E (steady.burst_plan): 3 s here
    monkeypatch.setattr(load_test, "burst_plan", lambda kind, n, e2e, seed: PointPlan(kind, None, n, 0, 0, 3.0, seed))
    log = tmp_path / "verify.log"

    def run():
        load_test.load_test(folder, silent_server, "key", "m", tmp_path, log)

    error, wall = outcome_within(3 + SLACK_S + 30, run)
    assert isinstance(error, RuntimeError) and 3 <= wall <= 3 + SLACK_S + 5, (error, wall)
    assert str(error) == (
        f"{folder}: load test: the warm-up's 2 requests at once had not completed after 3 s, their bound (60 s + "
        f"10 x the SLO's E2E of 3 s); see {log}"
    )


def test_verify_publisheds_one_question_to_a_server_that_never_answers_ends_at_its_bound(silent_server, monkeypatch):
    """verify-published asked its one question with the openai client's defaults: 600 s, three attempts."""
    pytest.importorskip("openai")
    import pipeline.publish.verify as verify

    fast = Pace(first_token_s=1.0, request_tok_s=192.0, server_tok_s=400.0)  # 1 s + 128 + 64 tokens at 192 tok/s
    monkeypatch.setattr(verify, "CPU_PACE", fast)
    monkeypatch.setattr(verify, "GPU_PACE", fast)
    error, wall = outcome_within(2 + SLACK_S + 10, lambda: verify.ask_once(f"{silent_server}/v1", "key", "m"))
    assert isinstance(error, RuntimeError) and 2 <= wall <= 2 + SLACK_S, (error, wall)
    assert str(error) == (
        f"{silent_server}/v1/chat/completions: no answer in 2 s, its bound (1 s to a first token + 128 prompt and 64 "
        "new tokens at 192 tok/s, 1 requests in flight); the server takes requests but does not answer them"
    )


def test_a_vllm_run_of_the_quantizer_that_hangs_is_stopped_whole_at_its_bound(tmp_path):
    """make quantize's smoke test and model answers run vLLM in the serve environment as a subprocess, and
    waited for it without end: an engine that hangs held the stage for good."""
    import psutil

    from pipeline.quantize.serve_env import run_in_serve_env, vllm_run_wait

    pid_file = tmp_path / "child.pid"  # a process under it, as vLLM's engine core is
    hang = (
        f"import pathlib, subprocess, time; child = subprocess.Popen(['sleep', '120']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); time.sleep(120)"
    )
    error, wall = outcome_within(
        2 + SLACK_S + 15,
        lambda: run_in_serve_env("timeit", "-n", "1", "-r", "1", hang, wait=Wait(2, "2 s for the test")),
    )
    assert isinstance(error, RuntimeError) and 2 <= wall <= 2 + SLACK_S + 10, (error, wall)
    assert (
        str(error)
        == "python -m timeit (vLLM, the serve environment): no result in 2 s, its bound (2 s for the test); stopped"
    )
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    # the smoke test's bound: the engine's start, then its few tokens at this machine's pace
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 5_000_000)
    wait = vllm_run_wait(tmp_path, [64], 8)
    assert wait.seconds > start_wait(tmp_path).seconds and wait.why.startswith(
        start_wait(tmp_path).why + ", then 1 prompts"
    )
