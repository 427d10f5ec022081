"""Every store transfer is bounded (pipeline/publish/puller/s3_reads.py's TransferPace): make publish
REGISTRY=s3://... (boto3), the puller (the standard library) and REGISTRY=hf://... (huggingface_hub) give up on a
store that accepts and never answers, or sends an object slower than its bound, in one line naming the object, the
store and how long they waited. Against real servers on 127.0.0.1: a TCP listener that reads whatever it is sent and
never writes a byte, and an HTTP server that trickles a body; no mock of boto3. The uploads and pulls against a real
S3 server are tests/test_registry.py's. Runs where boto3 is: .venv-serve."""

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_hub import hub_env

pytest.importorskip("boto3")

from pipeline.identity import tree_hash
from pipeline.publish.puller import __main__ as puller
from pipeline.publish.puller import s3_reads
from pipeline.publish.puller.s3_reads import TransferPace
from pipeline.publish.registry import RegistryError, Store, s3_client, upload
from pipeline.settings import ROOT

# small enough for a test to wait out: 0.5 s a request + its bytes at 2 MiB/s, two attempts
TEST_PACE = TransferPace(start_s=0.5, bytes_per_s=2 * 2**20, attempts=2, connect_s=2.0)
SLACK_S = 3.0  # botocore's back-off between attempts (up to 1 s) and a loaded 2-core machine


@pytest.fixture()
def silent_store():
    """A TCP listener on 127.0.0.1 that accepts every connection and reads what it is sent, and never
    answers: a store whose front end takes requests while nothing behind it works."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drain(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            while not stop.is_set():
                try:
                    if not conn.recv(1 << 16):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    listener.close()


@pytest.fixture()
def aws_at(monkeypatch, tmp_path):
    """AWS_* settings that reach `endpoint` with made-up keys, nothing from the machine's own files."""

    def point(endpoint: str) -> None:
        for k in list(os.environ):
            if k.startswith("AWS_"):
                monkeypatch.delenv(k)
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "AKTEST", "AWS_SECRET_ACCESS_KEY": "secret"}
        env |= {"AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "none")}
        env |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
        for k, v in env.items():
            monkeypatch.setenv(k, v)

    monkeypatch.setattr(s3_reads, "STORE_PACE", TEST_PACE)
    return point


def timed(work) -> tuple[BaseException | None, float]:
    """(what `work` raised, its wall time), failing the test where it still waits after 60 s."""
    done: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            work()
        except BaseException as e:  # handed to the test
            done["error"] = e
        done["wall"] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "still waiting after 60 s: the wait has no bound"
    return done.get("error"), done["wall"]


def published(folder: Path, size: int) -> Path:
    """A published folder's shape: one file of `size` bytes and manifest.json with its tree hash."""
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(os.urandom(size))
    files = {"model.bin": hashlib.sha256((folder / "model.bin").read_bytes()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"name": folder.name, "sha256": tree_hash(files), "files": files}))
    return folder


def test_a_transfers_bound_grows_with_its_bytes_and_reaches_botocore(aws_at, silent_store):
    aws_at(silent_store)
    assert TEST_PACE.request_s(0) == 0.5 and TEST_PACE.request_s(4 * 2**20) == pytest.approx(2.5)
    config = s3_client(4 * 2**20).meta.config
    assert config.read_timeout == pytest.approx(2.5) and config.connect_timeout == 2.0
    assert config.retries == {"total_max_attempts": 2, "mode": "standard"}
    assert s3_reads.STORE_PACE.why(2**20) == "2 attempts of 0.5 s + 1.0 MiB at 2 MiB/s"


def test_publish_to_a_store_that_never_answers_ends_in_one_line(aws_at, silent_store, tmp_path):
    """Issue 42: make publish REGISTRY=s3://... against a store that accepts and never answers waited
    botocore's defaults, 60 s a read and five attempts, for every request, and then printed botocore's text."""
    aws_at(silent_store)
    folder = published(tmp_path / "tiny-bf16", 1000)
    error, wall = timed(lambda: upload(folder, "s3://models/p"))
    assert isinstance(error, RegistryError), error
    line = str(error)
    assert "\n" not in line and line.startswith(f"s3://models: no answer from the store at {silent_store} in ")
    assert "its bound (2 attempts of 0.5 s)" in line and line.endswith("the network and the store")
    assert 2 * 0.5 <= wall <= 2 * 0.5 + SLACK_S, wall


def test_an_objects_upload_is_bounded_by_its_bytes(aws_at, silent_store, tmp_path):
    aws_at(silent_store)
    folder = published(tmp_path / "tiny-bf16", 4 * 2**20)  # 0.5 s + 4 MiB at 2 MiB/s = 2.5 s an attempt
    store = Store(s3_client(), "models", "p/tiny-bf16", "v1", folder, multipart_mb=64)
    want = {"size": 4 * 2**20, "sha256": "0" * 64}
    error, wall = timed(lambda: store.put("model.bin", want))
    assert isinstance(error, RegistryError), error
    line = str(error)
    assert line.startswith(f"s3://models/p/tiny-bf16/v1/model.bin: no answer from the store at {silent_store} in ")
    waited = float(re.search(r" in (\d+) s, its bound", line).group(1))
    assert "its bound (2 attempts of 0.5 s + 4.0 MiB at 2 MiB/s)" in line and "\n" not in line
    assert 2 * 2.5 <= wall <= 2 * 2.5 + SLACK_S and abs(waited - wall) <= 1, (wall, line)


def test_pull_from_a_store_that_never_answers_ends_in_one_line(aws_at, silent_store, tmp_path, capsys):
    aws_at(silent_store)
    into = tmp_path / "pulled"
    args = ["s3://models/p", "--name", "tiny-bf16", "--version", "latest", "--into", str(into)]
    codes = []
    error, wall = timed(lambda: codes.append(puller.main(args)))
    err = capsys.readouterr().err
    assert error is None and codes == [1] and err.count("\n") == 1, (error, err)
    assert err.startswith(
        f"pull: s3://models/p/tiny-bf16/aliases/latest.json: not received from the store at {silent_store} in "
    )
    assert "its bound (2 attempts of 0.5 s): timed out; check AWS_ENDPOINT_URL" in err
    assert 2 * 0.5 + 1 <= wall <= 2 * 0.5 + 1 + SLACK_S and not into.exists()  # + 1 s between the attempts


@pytest.fixture()
def trickling_store():
    """An HTTP server that answers every GET with a 1 MiB body, 1 KiB every 0.1 s: alive, and far slower
    than the test pace's 2 MiB/s."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(2**20))
            self.end_headers()
            try:
                for _ in range(1024):
                    self.wfile.write(b"\0" * 1024)
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:  # the client gave up
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_object_sent_slower_than_its_bound_is_given_up_on(trickling_store, tmp_path, monkeypatch):
    """A store that keeps sending, a byte at a time, never trips a socket's timeout: the object's bound is
    its bytes at the pace's rate, checked as it streams."""
    monkeypatch.setattr(s3_reads, "STORE_PACE", TEST_PACE)
    settings = {"endpoint": trickling_store, "region": "us-east-1", "credentials": None}
    target = tmp_path / "model.bin"
    read = puller.receive_into(target)
    error, wall = timed(lambda: s3_reads.s3_get(settings, "models", "p/model.bin", read=read, nbytes=2**20))
    assert isinstance(error, s3_reads.PullError), error
    line = str(error)
    assert line.startswith(f"s3://models/p/model.bin: not received from the store at {trickling_store} in ")
    assert "its bound (2 attempts of 0.5 s + 1.0 MiB at 2 MiB/s): slower than its bound after " in line
    assert 2 * 1.0 + 1 <= wall <= 2 * 1.0 + 1 + SLACK_S, wall  # 0.5 s + 1 MiB at 2 MiB/s, twice, 1 s apart


def test_publish_to_a_hub_that_never_answers_ends_in_one_line(silent_store, tmp_path):
    """REGISTRY=hf://...: huggingface_hub's own client has no timeout at all."""
    pytest.importorskip("huggingface_hub")
    folder = published(tmp_path / "tiny-bf16", 1000)
    code = (
        "import sys; from pathlib import Path; from pipeline.publish.puller import s3_reads\n"
        "s3_reads.STORE_PACE = s3_reads.TransferPace(start_s=0.5, bytes_per_s=2 * 2**20, attempts=2, connect_s=2.0)\n"
        "from pipeline.publish.upload import upload_to\n"
        "try: upload_to(Path(sys.argv[1]), 'hf://test-org/tiny-bf16')\n"
        "except RuntimeError as e: sys.exit(f'publish: {e}')"  # as the CLI prints it
    )
    env = hub_env(silent_store)
    t0 = time.monotonic()
    got = subprocess.run(
        [sys.executable, "-c", code, str(folder)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    wall = time.monotonic() - t0
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stderr[-3000:]
    assert got.stderr.startswith(
        f"publish: hf://test-org/tiny-bf16: no answer from the Hub to POST {silent_store}/api/repos/create in "
    )
    assert "each request bounded at 0.5 s + 1,000 bytes at 2 MiB/s: ReadTimeout; check HF_ENDPOINT" in got.stderr
    assert wall <= 0.5 + 30, wall  # the interpreter's start and huggingface_hub's import are most of it
