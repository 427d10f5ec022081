"""REGISTRY=hf://org/name (pipeline/publish/hub.py) against a local HTTP server on 127.0.0.1 that answers as the
Hub's API does (HF_ENDPOINT points huggingface_hub at it): repository creation, preupload (which files go
through LFS), the LFS batch API with a basic upload action, the upload itself and the NDJSON commit. The
responses follow the shapes huggingface_hub's client reads (huggingface_hub/_commit_api.py, lfs.py); they
were not captured from the live Hub, which is unreachable here: this proves the request flow and the bytes
sent, not that the live Hub accepts them. hf_xet is switched off (HF_HUB_DISABLE_XET=1), so the legacy
LFS path is the one tested; against the live Hub huggingface_hub would upload large files through Xet."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

from pipeline.identity import tree_hash
from pipeline.publish.hub import parse_hub
from pipeline.publish.puller.version_files import folder_version
from pipeline.schema import ConfigError
from pipeline.settings import ROOT

REPO = "test-org/tiny-bf16"
COMMIT = "c0ffee" + "0" * 34


class Hub(BaseHTTPRequestHandler):
    """Replays the Hub's answers; keeps every request (method, path, body) and every LFS upload's bytes."""

    requests: list = []
    uploads: dict = {}
    token_ok = True

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict | None = None):
        data = json.dumps(body or {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).requests.append((method, self.path, body, self.headers.get("Authorization")))
        if not type(self).token_ok and not self.path.startswith("/lfs-upload/"):
            return self._answer(401, {"error": "Invalid credentials in Authorization header"})
        endpoint = f"http://127.0.0.1:{self.server.server_port}"
        if method == "POST" and self.path == "/api/repos/create":
            return self._answer(200, {"url": f"{endpoint}/{REPO}", "name": REPO})
        if method == "POST" and self.path == "/api/validate-yaml":  # the model card's metadata, checked first
            return self._answer(200, {"errors": [], "warnings": []})
        if method == "POST" and self.path == f"/api/models/{REPO}/preupload/main":
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular"}
                for f in files
            ]
            return self._answer(200, {"files": [m | {"shouldIgnore": False, "oid": None} for m in modes]})
        if method == "POST" and self.path == f"/{REPO}.git/info/lfs/objects/batch":
            objects = json.loads(body)["objects"]
            actions = [
                o | {"actions": {"upload": {"href": f"{endpoint}/lfs-upload/{o['oid']}"}}, "authenticated": True}
                for o in objects
            ]
            return self._answer(200, {"transfer": "basic", "objects": actions})
        if method == "PUT" and self.path.startswith("/lfs-upload/"):
            type(self).uploads[self.path.rsplit("/", 1)[1]] = body
            return self._answer(200)
        if method == "POST" and self.path == f"/api/models/{REPO}/commit/main":
            return self._answer(200, {"commitUrl": f"{endpoint}/{REPO}/commit/{COMMIT}", "commitOid": COMMIT})
        return self._answer(404, {"error": f"not replayed: {method} {self.path}"})

    def do_POST(self):
        self._route("POST")

    def do_PUT(self):
        self._route("PUT")

    def do_GET(self):
        self._route("GET")


@pytest.fixture
def hub():
    Hub.requests, Hub.uploads, Hub.token_ok = [], {}, True
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def published_folder(folder: Path) -> Path:
    """A folder as make publish leaves it: files, and manifest.json with their sha256 and its tree hash."""
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("---\nlibrary_name: vllm\n---\n# tiny-bf16\n")
    (folder / "serve.yaml").write_text("model: .\n")
    (folder / "model.safetensors").write_bytes(os.urandom(300_000))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
    (folder / "manifest.json").write_text(json.dumps({"name": "tiny-bf16", "sha256": tree_hash(files), "files": files}))
    return folder


def hub_env(endpoint: str) -> dict:
    """A process's environment for huggingface_hub against the Hub stand-in at `endpoint` (read on import)."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_TOKEN": "hf_test", "HF_HUB_DISABLE_XET": "1"}
    return env | {"HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1"}


def upload(folder: Path, endpoint: str, url: str = f"hf://{REPO}") -> subprocess.CompletedProcess:
    """pipeline.publish.hub.upload_hub in a process of its own: huggingface_hub reads HF_ENDPOINT on import."""
    code = (
        "import sys; from pathlib import Path; from pipeline.publish.upload import upload_to\n"
        "from pipeline.schema import ConfigError\n"
        "try: upload_to(Path(sys.argv[1]), sys.argv[2])\n"
        "except (ConfigError, RuntimeError) as e: sys.exit(f'publish: {e}')"  # as the CLI prints them
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(folder), url],
        env=hub_env(endpoint),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_published_folder_goes_up_as_one_commit_with_lfs_for_the_weights(hub, tmp_path):
    folder = published_folder(tmp_path / "tiny-bf16")
    got = upload(folder, hub)
    assert got.returncode == 0, got.stderr
    assert f"commit {COMMIT}" in got.stdout
    paths = [(m, p) for m, p, _, _ in Hub.requests]
    assert paths[0] == ("POST", "/api/repos/create")
    assert json.loads(Hub.requests[0][2]) | {
        "visibility": "private",
        "name": "tiny-bf16",
        "organization": "test-org",
    } == json.loads(Hub.requests[0][2])
    assert all(auth == "Bearer hf_test" for m, p, _, auth in Hub.requests if not p.startswith("/lfs-upload/"))
    # the weights through LFS, byte for byte, under their sha256
    weights = (folder / "model.safetensors").read_bytes()
    assert Hub.uploads == {hashlib.sha256(weights).hexdigest(): weights}
    # one commit: every file; the small ones inline, byte for byte; the weights as an LFS pointer
    (commit,) = [b for m, p, b, _ in Hub.requests if p == f"/api/models/{REPO}/commit/main"]
    lines = [json.loads(line) for line in commit.decode().splitlines()]
    header = lines[0]["value"]
    assert header["summary"] == f"tiny-bf16 version {folder_version(folder)}"
    inline = {e["value"]["path"]: base64.b64decode(e["value"]["content"]) for e in lines if e["key"] == "file"}
    lfs = {e["value"]["path"]: e["value"] for e in lines if e["key"] == "lfsFile"}
    assert inline == {rel: (folder / rel).read_bytes() for rel in ("README.md", "manifest.json", "serve.yaml")}
    assert lfs["model.safetensors"]["oid"] == hashlib.sha256(weights).hexdigest()
    assert lfs["model.safetensors"]["size"] == len(weights)


def test_a_refused_token_and_a_folder_unlike_its_manifest_are_one_line_each(hub, tmp_path):
    folder = published_folder(tmp_path / "tiny-bf16")
    Hub.token_ok = False
    got = upload(folder, hub)
    assert got.returncode != 0
    assert len(got.stderr.splitlines()) == 1, got.stderr
    assert "the Hub refused this token" in got.stderr and "HF_TOKEN" in got.stderr
    (folder / "serve.yaml").write_text("model: elsewhere\n")
    Hub.token_ok, Hub.requests = True, []
    got = upload(folder, hub)
    assert got.returncode != 0 and len(got.stderr.splitlines()) == 1, got.stderr
    assert "serve.yaml: differs from manifest.json" in got.stderr
    assert Hub.requests == []  # nothing sent


def test_hub_urls():
    assert parse_hub("hf://org/name") == "org/name"
    for bad in ("hf://org", "hf://org/name/extra", "hf://org/na me", "s3://org/name"):
        with pytest.raises(ConfigError, match="expected hf://org/name"):
            parse_hub(bad)
