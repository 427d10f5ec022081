"""Replies of a store checked where they enter (issue 42, held-out members of the class): an alias or a
marker of another shape, an alias that names an alias, a listing that is not S3's XML, a marker's sizes and
paths. Each is one line and nothing created, for make pull (pipeline/publish/puller/) and for make publish
REGISTRY=... (pipeline/publish/registry.py). Against a real SeaweedFS on 127.0.0.1 (tests/s3_store.py),
and for the listing a real HTTP server on 127.0.0.1 that answers every GET with something else."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("boto3")

from s3_store import BUCKET, seaweedfs, url_for  # noqa: E402

from pipeline.identity import tree_hash  # noqa: E402
from pipeline.publish.puller import FOLDER as PULLER  # noqa: E402
from pipeline.publish.registry import RegistryError, upload  # noqa: E402


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        saved = dict(os.environ)
        os.environ.update(server["env"])
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)


def published_folder(folder: Path) -> Path:
    """A published folder's shape (a file, SHA256SUMS, manifest.json)."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(hashlib.shake_256(folder.name.encode()).digest(1000))
    sums = {"model.safetensors": hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()}
    (folder / "SHA256SUMS").write_text("".join(f"{h}  {rel}\n" for rel, h in sums.items()))
    files = {**sums, "SHA256SUMS": hashlib.sha256((folder / "SHA256SUMS").read_bytes()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"name": folder.name, "sha256": tree_hash(files), "files": files}))
    return folder


def pull_py(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(PULLER), *map(str, args)],
        capture_output=True,
        text=True,
        env=env or os.environ,
        timeout=300,
    )


def one_line(got: subprocess.CompletedProcess, expected: str) -> None:
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
    assert got.stderr == f"pull: {expected}\n", got.stderr


@pytest.mark.parametrize(
    ("alias", "problem"),
    [
        (["0123456789abcdef"], "not a JSON object; the store holds something else there"),
        ("0123456789abcdef", "not a JSON object; the store holds something else there"),
        ({"version": "latest"}, "names 'latest', not a version (16 hex digits); an alias points at a version"),
        ({"version": 123}, "names 123, not a version (16 hex digits); an alias points at a version"),
        ({}, "names None, not a version (16 hex digits); an alias points at a version"),
    ],
    ids=["a list", "a string", "itself", "a number", "nothing"],
)
def test_an_alias_of_another_shape_is_one_line_for_pull_and_publish(s3, tmp_path, alias, problem):
    folder = published_folder(tmp_path / "alias-bf16")
    url = url_for("alias")
    name, version, where = upload(folder, url)
    root = where.split("/", 3)[3].rsplit("/", 1)[0]
    key = f"{root}/aliases/latest.json"
    s3["client"].put_object(Bucket=BUCKET, Key=key, Body=json.dumps(alias).encode())
    one_line(
        pull_py(url, "--name", name, "--version", "latest", "--into", tmp_path / "pulled"),
        f"s3://{BUCKET}/{key}: {problem}",
    )
    assert not (tmp_path / "pulled").exists()
    if isinstance(alias, dict):
        return  # the registry moves such an alias to the version it publishes
    with pytest.raises(RegistryError) as e:
        upload(folder, url)
    assert str(e.value) == f"s3://{BUCKET}/{key}: not a JSON object; something else writes there"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: f["model.safetensors"].update(size=-1), "'model.safetensors' has size -1"),
        (lambda f: f["model.safetensors"].update(size=1000.0), None),
        (lambda f: f.update({"": f["SHA256SUMS"]}), "lists '', not a file's path inside the folder"),
        (lambda f: f.update({"sub/": f["SHA256SUMS"]}), "lists 'sub/', not a file's path inside the folder"),
        (lambda f: f.update({"./x": f["SHA256SUMS"]}), "lists './x', not a file's path inside the folder"),
    ],
    ids=["negative size", "size a float", "empty path", "a folder's path", "a dot"],
)
def test_a_marker_s_sizes_and_paths_are_checked_before_any_file_is_fetched(s3, tmp_path, change, problem):
    folder = published_folder(tmp_path / "marker-bf16")
    url = url_for("marker")
    name, version, where = upload(folder, url)
    root = where.split("/", 3)[3].rsplit("/", 1)[0]
    key = f"{root}/versions/{version}.json"
    marker = json.loads(s3["client"].get_object(Bucket=BUCKET, Key=key)["Body"].read())
    change(marker["files"])
    s3["client"].put_object(Bucket=BUCKET, Key=key, Body=json.dumps(marker).encode())
    got = pull_py(url, "--name", name, "--version", version, "--into", tmp_path / "pulled")
    shape = "not a version marker pipeline/publish/registry.py writes ({files: {path: {size, sha256}}})"
    one_line(got, f"s3://{BUCKET}/{key}: {shape}" + (f": {problem}" if problem else ""))
    assert not (tmp_path / "pulled").exists()


class Answers(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "body",
    [b"hello, not XML", b"<ListBucketResult><CommonPrefixes></CommonPrefixes></ListBucketResult>"],
    ids=["not XML", "a prefix without its name"],
)
def test_a_listing_that_is_not_s3_s_is_one_line(tmp_path, body):
    """make pull without --name lists the published names: a reply that is not an S3 listing (a web server,
    a proxy's page at the endpoint) is one line naming the endpoint, not an XML parser's traceback."""
    handler = type("Handler", (Answers,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "PATH": os.environ["PATH"],
    }
    env |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    try:
        got = pull_py("s3://b/p", "--model", "m", "--version", "latest", "--under", tmp_path / "pulled", env=env)
    finally:
        server.shutdown()
        server.server_close()
    one_line(got, f"s3://b/p/: the listing from {endpoint} is not an S3 ListObjectsV2 reply; check AWS_ENDPOINT_URL")
    assert not (tmp_path / "pulled").exists()
