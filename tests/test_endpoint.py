"""pipeline/evaluate/endpoint_check.py: a running vLLM server checked before eval runs its suites on it (make eval
ENDPOINT=...), against the session's real tiny server (conftest's tiny_server): what it records, and the
one line each wrong setting gets. The checks of the model chosen, its max_model_len and the key also run
in the fast tests, against a tiny real HTTP server on 127.0.0.1 that answers /v1/models as vLLM does."""

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import datetime

import pytest

from pipeline.evaluate.endpoint_check import KEY_VARIABLES, api_key_from_environment, base_url, connect, default_name
from pipeline.schema import ConfigError, EndpointInfo
from pipeline.serving import free_port
from pipeline.settings import ROOT

from stage_files import write_manifest


def test_the_url_is_the_openai_base_url_without_credentials():
    assert base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert base_url("https://llm.example.org/team/v1") == "https://llm.example.org/team/v1"
    for bad, said in (
        ("127.0.0.1:8000/v1", "not an http(s) URL"),
        ("ftp://host/v1", "not an http(s) URL"),
        ("http://127.0.0.1:8000", "ends in /v1"),
        ("http://127.0.0.1:8000/v1/completions", "ends in /v1"),
        ("http://127.0.0.1:8000/v1?key=x", "ends in /v1"),
    ):
        with pytest.raises(ConfigError, match=f"ENDPOINT={re.escape(bad)}: .*{re.escape(said)}"):
            base_url(bad)
    with pytest.raises(
        ConfigError, match="^ENDPOINT: a URL with credentials in it; export the key as ENDPOINT_API_KEY"
    ):
        base_url("http://me:secret@127.0.0.1:8000/v1")


def test_the_results_label_comes_from_the_served_model_id():
    assert default_name("/models/smollm2-135m-instruct-gptq-w4a16") == "smollm2-135m-instruct-gptq-w4a16"
    assert default_name("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B") == "DeepSeek-R1-Distill-Qwen-1.5B"
    assert default_name("my model:latest") == "my-model-latest"
    assert default_name(".hidden") == "hidden"
    assert default_name("///") == "served"


def test_the_key_comes_from_endpoint_api_key_else_vllm_api_key(monkeypatch):
    monkeypatch.delenv("ENDPOINT_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert api_key_from_environment() == (None, "ENDPOINT_API_KEY")
    monkeypatch.setenv("VLLM_API_KEY", "published")
    assert api_key_from_environment() == ("published", "VLLM_API_KEY")
    monkeypatch.setenv("ENDPOINT_API_KEY", "mine")
    assert api_key_from_environment() == ("mine", "ENDPOINT_API_KEY")


def test_an_unreachable_endpoint_is_one_line():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError) as e:
        connect(url, "key", None)
    assert str(e.value) == f"ENDPOINT={url}: no server answers (connection refused); start it or fix the URL"


class _NotVllm(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<html>a web page</html>" if self.path == "/v1/models" else b""
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_openai_compatible_is_one_line():
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        with pytest.raises(ConfigError, match=r"did not answer a JSON object; is this a vLLM server\?$"):
            connect(f"http://127.0.0.1:{port}/v1", None, None)
        with pytest.raises(ConfigError, match=r"answered 404 Not Found; is this a vLLM server\?$"):
            connect(f"http://127.0.0.1:{port}/other/v1", None, None)
    finally:
        server.shutdown()


class _Models(http.server.BaseHTTPRequestHandler):
    """A stand-in for vLLM's model list: GET /v1/models answers `cards` (the ids and max_model_len the server
    would report) to a request with `key` (None: any), GET /version `version`; nothing else."""

    cards: list = []
    key: str | None = None
    version = "0.26.0"

    def do_GET(self):
        if self.key is not None and self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        docs = {"/v1/models": {"object": "list", "data": self.cards}, "/version": {"version": self.version}}
        body = json.dumps(docs[self.path]).encode() if self.path in docs else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def models_server():
    """A tiny real HTTP server on 127.0.0.1 answering /v1/models: yields (base URL, its handler class,
    whose `cards` and `key` a test sets)."""
    handler = type("Models", (_Models,), {"cards": [], "key": None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    finally:
        server.shutdown()
        server.server_close()


def card(model_id: str, max_model_len) -> dict:
    return {"id": model_id, "object": "model", "root": f"/models/{model_id}", "max_model_len": max_model_len}


def test_the_served_model_is_the_only_one_or_the_one_named(models_server):
    url, handler = models_server
    handler.cards = [card("small", 512)]
    info = connect(url, None, None, need=512)  # exactly its max_model_len: fits
    assert (info.model, info.max_model_len, info.served, info.vllm_version) == ("small", 512, ["small"], "0.26.0")
    assert info.root == "/models/small" and info.url == url
    with pytest.raises(ConfigError) as e:  # named: never another model, even the only one served
        connect(url, None, "gpt-4")
    assert str(e.value) == f"ENDPOINT_MODEL=gpt-4: {url} does not serve it; it serves small"
    handler.cards = [card("small", 512), card("large", 4096)]
    with pytest.raises(ConfigError) as e:
        connect(url, None, None)
    assert str(e.value) == f"ENDPOINT_MODEL: unset, and {url} serves 2 models (small, large); set it to one"
    named = connect(url, None, "large", need=4096)  # the named one, with its own max_model_len
    assert (named.model, named.max_model_len, named.served) == ("large", 4096, ["small", "large"])
    assert connect(url, None, "small").max_model_len == 512
    with pytest.raises(ConfigError) as e:
        connect(url, None, "gpt-4")
    assert str(e.value) == f"ENDPOINT_MODEL=gpt-4: {url} does not serve it; it serves small, large"
    handler.cards = []
    with pytest.raises(ConfigError) as e:
        connect(url, None, "gpt-4")
    assert str(e.value) == f"ENDPOINT_MODEL=gpt-4: {url} does not serve it; it serves nothing"


def test_a_request_longer_than_the_served_max_model_len_is_one_line(models_server):
    url, handler = models_server
    handler.cards = [card("small", 512), card("large", 4096)]
    assert connect(url, None, "small", need=512).max_model_len == 512
    with pytest.raises(ConfigError) as e:
        connect(url, None, "small", need=513)  # one token more than the named model takes, though "large" would
    assert str(e.value) == (
        f"ENDPOINT={url}: small is served with max_model_len 512, the suites need 513 tokens (longest prompt + "
        "max_tokens); lower MAX_TOKENS or serve it with a larger --max-model-len"
    )
    for missing in (None, 0, "4096"):
        handler.cards = [card("small", missing)]
        with pytest.raises(ConfigError) as e:
            connect(url, None, None)
        assert str(e.value) == f"ENDPOINT={url}: small has no max_model_len in /v1/models; is this a vLLM server?"


def test_a_wrong_or_missing_key_is_one_line(models_server):
    url, handler = models_server
    handler.cards, handler.key = [card("small", 512)], "the-servers-key"
    assert connect(url, "the-servers-key", None).model == "small"
    with pytest.raises(ConfigError) as e:
        connect(url, "not-its-key", None, key_from="VLLM_API_KEY")
    assert str(e.value) == (
        f"ENDPOINT={url}: the server refuses the key in VLLM_API_KEY (401); export the server's key as ENDPOINT_API_KEY"
    )
    with pytest.raises(ConfigError) as e:
        connect(url, None, None)
    assert str(e.value) == (
        f"ENDPOINT={url}: the server wants an API key (401); export it as ENDPOINT_API_KEY (or VLLM_API_KEY)"
    )


@pytest.mark.e2e
def test_connect_records_what_a_real_server_reports(tiny_model, tiny_server):
    """bench/cpu-test.yaml's server of the tiny model (max_model_len 256): the only model it serves is
    taken, named as vLLM names it (the path it loaded), with vLLM's version; never the key."""
    import vllm

    url = f"http://127.0.0.1:{tiny_server.port}/v1"
    info = connect(url + "/", tiny_server.api_key, None, need=256)
    assert isinstance(info, EndpointInfo)
    assert (info.url, info.model, info.root, info.max_model_len) == (url, str(tiny_model), str(tiny_model), 256)
    assert info.served == [str(tiny_model)] and info.vllm_version == vllm.__version__
    datetime.fromisoformat(info.checked_at)
    assert tiny_server.api_key not in info.model_dump_json()
    named = connect(url, tiny_server.api_key, str(tiny_model))  # ENDPOINT_MODEL given: the same facts
    assert named.model_dump(exclude={"checked_at"}) == info.model_dump(exclude={"checked_at"})


@pytest.mark.e2e
def test_each_wrong_setting_against_a_real_server_is_one_line(tiny_model, tiny_server):
    url = f"http://127.0.0.1:{tiny_server.port}/v1"
    key = tiny_server.api_key
    cases = [
        (
            dict(api_key="not-its-key", model=None, key_from="VLLM_API_KEY"),
            f"ENDPOINT={url}: the server refuses the key in VLLM_API_KEY (401); export the server's key as "
            "ENDPOINT_API_KEY",
        ),
        (
            dict(api_key=None, model=None),
            f"ENDPOINT={url}: the server wants an API key (401); export it as ENDPOINT_API_KEY (or VLLM_API_KEY)",
        ),
        (
            dict(api_key=key, model="gpt-4"),
            f"ENDPOINT_MODEL=gpt-4: {url} does not serve it; it serves {tiny_model}",
        ),
        (
            dict(api_key=key, model=None, need=257),
            f"ENDPOINT={url}: {tiny_model} is served with max_model_len 256, the suites need 257 tokens (longest "
            "prompt + max_tokens); lower MAX_TOKENS or serve it with a larger --max-model-len",
        ),
    ]
    for kwargs, line in cases:
        with pytest.raises(ConfigError) as e:
            connect(url, **kwargs)
        assert str(e.value) == line


# ------------------------------------------------------------------------- the stage: make eval ENDPOINT=
SUITES = {  # small enough for the tiny server's max_model_len (256)
    "math": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 6\nprompt: '{question}'\n"
    "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\ngeneration: {max_tokens: 12}\n",
    "held-out": 'description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: "{question}\\n{answer}"\n'
    "chat_template: false\ngold_field: null\nmetric: fidelity\ntop_logprobs: 5\n",
}


def suite_files(folder, **changes) -> list:
    paths = []
    for name, text in (SUITES | changes).items():
        (folder / f"{name}.yaml").write_text(text)
        paths.append(folder / f"{name}.yaml")
    return paths


def run_stage(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.evaluate", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k not in KEY_VARIABLES} | env,
    )


@pytest.mark.e2e
def test_the_stage_checks_the_endpoint_before_it_writes_anything(tmp_path, tiny_model, tiny_server):
    """`python -m pipeline.evaluate endpoint` (make eval ENDPOINT=...) against the real tiny server: the
    suites planned with MODEL's tokenizer, then a wrong key, a model it does not serve and a request longer
    than its max_model_len each one line, exit 2, and nothing under the model's folder."""
    url = f"http://127.0.0.1:{tiny_server.port}/v1"
    model_dir = tmp_path / "artifacts/tiny"
    args = ["endpoint", model_dir, "--source", tiny_model, "--url", url, "--limit", 2, "--suites"]
    cases = [
        (suite_files(tmp_path), {"VLLM_API_KEY": "the-users-key"}, "the server refuses the key in VLLM_API_KEY (401)"),
        (suite_files(tmp_path), {"ENDPOINT_API_KEY": tiny_server.api_key}, "ENDPOINT_MODEL=gpt-4: "),
        (
            suite_files(tmp_path, math=SUITES["math"].replace("max_tokens: 12", "max_tokens: 400")),
            {"ENDPOINT_API_KEY": tiny_server.api_key},
            "is served with max_model_len 256, the suites need",
        ),
    ]
    for number, (suites, env, said) in enumerate(cases):
        extra = ["--served-model", "gpt-4"] if number == 1 else []
        proc = run_stage(*args, *suites, *extra, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], proc.stderr[-2000:]
        assert tiny_server.api_key not in proc.stderr
    assert not model_dir.exists()


def test_the_stage_checks_the_served_model_and_its_max_model_len_before_it_writes_anything(
    tmp_path, embedded_source, models_server, monkeypatch
):
    """make eval ENDPOINT=...'s checks against the stand-in model list: the suites planned with MODEL's
    tokenizer, their longest request held to the *chosen* model's max_model_len; a model it does not serve,
    two served and none named, and a request one token too long each one line; through the command, exit 2
    and nothing written."""
    pytest.importorskip("transformers")
    from pipeline.evaluate.on_endpoint import Endpoint, plan_on_endpoint
    from pipeline.evaluate.options import EvalSettings
    from pipeline.evaluate.plan import plan_suites

    for variable in KEY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    url, handler = models_server
    model_dir = tmp_path / "artifacts/smol"
    suites = suite_files(tmp_path)
    settings = EvalSettings(suites, limit=2, greedy=True)
    need = plan_suites(embedded_source, settings).longest
    handler.cards = [card("small", need), card("large", need - 1)]
    planned = plan_on_endpoint(model_dir, str(embedded_source), Endpoint(url, 4, "small"), settings)
    assert (planned.endpoint.model, planned.variant) == ("small", model_dir / "endpoint-small")
    cases = [
        ([card("small", need - 1)], None, f"small is served with max_model_len {need - 1}, the suites need {need} "),
        ([card("small", need), card("large", need - 1)], "large", "large is served with"),
        ([card("small", need), card("large", need)], None, "ENDPOINT_MODEL: unset, and "),
        ([card("small", need)], "gpt-4", "ENDPOINT_MODEL=gpt-4: "),
    ]
    for cards, served, said in cases:
        handler.cards = cards
        with pytest.raises(ConfigError, match=re.escape(said)):
            plan_on_endpoint(model_dir, str(embedded_source), Endpoint(url, 4, served), settings)
    handler.cards = [card("small", need), card("large", need - 1)]
    args = ["endpoint", model_dir, "--source", embedded_source, "--url", url, "--limit", 2, "--suites", *suites]
    proc = run_stage(*args, "--served-model", "large", env={})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"large is served with max_model_len {need - 1}, the suites need {need} tokens" in lines[0]
    assert not model_dir.exists()


class _GoesAwayAfterOneCompletion(http.server.BaseHTTPRequestHandler):
    """In front of the real tiny server: forwards every request to it, until one completion has been
    answered; then it drops every connection without a reply, as a server that died mid-run does."""

    upstream = ""
    completions = 0
    lock = threading.Lock()

    def _forward(self, body: bytes | None):
        import urllib.error
        import urllib.request

        with self.lock:
            gone = self.path.endswith("/completions") and type(self).completions >= 1
            type(self).completions += self.path.endswith("/completions")
        if gone:
            self.close_connection = True
            return
        request = urllib.request.Request(self.upstream + self.path, data=body, method=self.command)
        for name in ("Authorization", "Content-Type"):
            if self.headers.get(name):
                request.add_header(name, self.headers[name])
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                status, payload = reply.status, reply.read()
        except urllib.error.HTTPError as e:
            status, payload = e.code, e.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self._forward(None)

    def do_POST(self):
        self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def log_message(self, *args):
        pass


@pytest.mark.e2e
def test_an_endpoint_that_goes_away_mid_run_is_one_line_and_writes_nothing(tmp_path, tiny_model, tiny_server):
    """The endpoint answers the checks and one completion, then drops every connection (a proxy in front of
    the real tiny server): the stage exits 2 with one line naming the endpoint, and leaves no folder."""
    _GoesAwayAfterOneCompletion.upstream = f"http://127.0.0.1:{tiny_server.port}"
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GoesAwayAfterOneCompletion)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
        model_dir = tmp_path / "artifacts/tiny"
        args = ["endpoint", model_dir, "--source", tiny_model, "--url", url, "--limit", 4, "--greedy"]
        proc = run_stage(*args, "--suites", *suite_files(tmp_path), env={"ENDPOINT_API_KEY": tiny_server.api_key})
    finally:
        proxy.shutdown()
        proxy.server_close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"error: ENDPOINT={url}: ") and lines[0].endswith("; nothing was written"), lines
    assert "Disconnected" in lines[0] and tiny_server.api_key not in proc.stderr
    assert _GoesAwayAfterOneCompletion.completions > 1 and not model_dir.exists()


@pytest.mark.e2e
def test_suites_through_an_endpoint_give_the_records_of_make_eval_on_the_same_checkpoint(
    tmp_path, tiny_model, tiny_server
):
    """The tiny model as a variant (make eval-<variant>) and served (the session's tiny server, make eval
    ENDPOINT=...), greedy: the same record of every item, the same fidelity arrays, deltas of zero, and
    the endpoint's results say what served them."""
    import numpy as np

    from pipeline.evaluate.compare import compare

    model_dir = tmp_path / "artifacts/tiny"
    shutil.copytree(tiny_model, model_dir / "bf16", ignore=shutil.ignore_patterns("manifest.json"))
    write_manifest(model_dir / "bf16", "tiny", "bf16", random_weights=True)
    suites = ["--suites", *suite_files(tmp_path), "--limit", 4, "--greedy"]
    proc = run_stage("run", model_dir / "bf16", *suites, env={})
    assert proc.returncode == 0, proc.stderr[-2000:]
    url = f"http://127.0.0.1:{tiny_server.port}/v1"
    args = ["endpoint", model_dir, "--source", tiny_model, "--url", url, "--name", "served", *suites]
    proc = run_stage(*args, env={"ENDPOINT_API_KEY": tiny_server.api_key})
    assert proc.returncode == 0, proc.stderr[-2000:]

    served = model_dir / "endpoint-served"
    info = EndpointInfo.model_validate_json((served / "endpoint.json").read_text())
    assert (info.url, info.model, info.max_model_len) == (url, str(tiny_model), 256)
    run = json.loads((served / "eval/results.json").read_text())["pipeline"]
    assert run["endpoint"] == info.model_dump(mode="json") and run["identity"] is None
    keep = ("doc_id", "seed", "prompt", "prompt_tokens", "output", "output_tokens", "finish_reason", "exact_match")
    records = {}
    for where in (model_dir / "bf16/eval", served / "eval"):
        lines = (where / "samples_math.jsonl").read_text().splitlines()
        records[where] = [{k: json.loads(line)[k] for k in keep} for line in lines]
    assert records[served / "eval"] == records[model_dir / "bf16/eval"] and len(records[served / "eval"]) == 4
    mine, theirs = (np.load(d / "fidelity_held-out.npz") for d in (served / "eval", model_dir / "bf16/eval"))
    assert (mine["token_ids"] == theirs["token_ids"]).all() and (mine["top_ids"] == theirs["top_ids"]).all()
    assert np.allclose(mine["logprob"], theirs["logprob"], atol=1e-4)
    report = compare(model_dir, "bf16")
    assert report.variants["endpoint-served"]["math:exact_match"].delta == 0
    assert report.endpoints["endpoint-served"] == info


def test_an_endpoints_run_record_names_the_server_and_no_checkpoint(tmp_path, embedded_source):
    """results.json's pipeline entry of an endpoint's run (write.run_meta): valid as EvalRun, with what the
    server reported and neither identity nor checksum (no manifest of this pipeline's)."""
    import dataclasses

    pytest.importorskip("transformers")

    from pipeline.evaluate.options import EvalSettings
    from pipeline.evaluate.plan import plan_suites
    from pipeline.evaluate.write import EngineRun, run_meta
    from pipeline.schema import EvalRun, check_data

    info = EndpointInfo(
        url="http://127.0.0.1:8000/v1", model="smol", root="/models/smol", max_model_len=2048, served=["smol"],
        vllm_version="0.26.0", checked_at="2026-12-02T00:00:00+00:00",
    )  # fmt: skip
    settings = EvalSettings(suite_files(tmp_path), limit=2, greedy=True, dtype="auto")
    planned = plan_suites(embedded_source, settings)
    planned = dataclasses.replace(planned, variant=tmp_path / "artifacts/smol/endpoint-smol", endpoint=info)
    engine = EngineRun(args={}, eager=False, replicas=1, tp=1, generate_s=1.0, generated=8)
    meta = run_meta(planned, settings, engine)
    record = check_data(EvalRun, meta | {"suites": {}}, tmp_path / "results.json")
    assert record.endpoint == info and record.identity is None and record.checkpoint_sha256 is None
    assert (record.variant, record.model) == ("endpoint-smol", "smol")
