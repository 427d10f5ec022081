"""The published folder in an object store: `make publish REGISTRY=s3://bucket/prefix` uploads it as an
immutable version; `make pull` / `make verify-published REGISTRY=...` and the deployment files fetch it
back with pipeline/pull.py (standard library only), which also documents the layout:

    <prefix>/<name>/<version>/<file>             every file of the published folder, byte for byte
    <prefix>/<name>/versions/<version>.json      the version marker, written last
    <prefix>/<name>/aliases/latest.json          moved to a version only once its marker is there

<version> is the first 16 hex digits of the folder's manifest.json sha256, so it names the content. Until
its marker exists a version is invisible (pull.py and this module read the marker first), so an upload
killed half-way leaves nothing a deployment can pull; the next run skips the objects already there with
the right size and sha256 (each object carries its sha256 as metadata) and uploads the rest. The marker
is written with If-None-Match: * (a conditional write: of two publishes at once, one writes it; the
other finds it and compares), and a marker with other content under the same version is refused.

boto3 takes the endpoint, region and credentials from the standard AWS environment variables and files
(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws/config, ...), so AWS S3, MinIO,
Ceph RGW and SeaweedFS all work.

REGISTRY=hf://org/name, the second target, is pipeline/hub.py's. The deployment files that pull a
version are the publish stage's (pipeline/publish/pull_deploy.py).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import urllib.parse
from pathlib import Path

from pipeline.artifacts import read_manifest, sha256_file
from pipeline.schema import ConfigError

PULLER = Path(__file__).with_name("pull.py")
VERSION_CHARS = 16  # as pull.py's
MIB = 2**20


class RegistryError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ the store
def parse_registry(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix); other schemes are one line (hf:// is pipeline/hub.py's)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "oci":
        raise ConfigError(
            f"REGISTRY={url}: oci:// is not supported (docs/published-files.md); use s3://bucket/prefix or hf://org/name"
        )
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"REGISTRY={url}: expected s3://bucket/prefix or hf://org/name")
    return parts.netloc, parts.path.strip("/")


def s3_client():
    import boto3
    from botocore.config import Config

    # "standard" retries transient errors (throttling, 5xx, dropped connections) with back-off
    # a new session: the default one keeps the credentials it found first, for the life of the process
    return boto3.session.Session().client(
        "s3", config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=10)
    )


@contextlib.contextmanager
def store_errors(where: str):
    """The store's failures as one line: settings problems as ConfigError, the rest as RegistryError."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as e:
        raise ConfigError(
            f"{where}: {e}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / ~/.aws/credentials)"
        ) from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket" or (code == "404" and e.operation_name == "HeadBucket"):
            raise ConfigError(f"{where}: no such bucket; create it first or fix REGISTRY") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status == 403:
            raise ConfigError(
                f"{where}: {code or status} (the store refused these credentials); check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY (or the profile) and the bucket's policy"
            ) from None
        raise RegistryError(f"{where}: {e}") from None
    except BotoCoreError as e:
        raise RegistryError(f"{where}: {e}; check AWS_ENDPOINT_URL and the network") from None


def _status(e) -> tuple[str, int | None]:
    return e.response.get("Error", {}).get("Code", ""), e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def get_json(client, bucket: str, key: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        code, status = _status(e)
        if code in ("NoSuchKey", "404") or status == 404:
            return None
        raise
    try:
        return json.loads(body)
    except ValueError:
        raise RegistryError(f"s3://{bucket}/{key}: not JSON; something else writes there") from None


def object_problem(client, bucket: str, key: str, want: dict) -> str | None:
    """Why the object is not the file `want` describes ({size, sha256}), or None when it is."""
    from botocore.exceptions import ClientError

    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        code, status = _status(e)
        if code in ("NoSuchKey", "404") or status == 404:
            return "missing"
        raise
    if head["ContentLength"] != want["size"]:
        return f"{head['ContentLength']} bytes, the file has {want['size']}"
    if head.get("Metadata", {}).get("sha256") != want["sha256"]:
        return "sha256 differs from the file's"
    return None


# ---------------------------------------------------------------------------------- the upload
def folder_files(folder: Path) -> tuple[dict, dict]:
    """(manifest.json, {path: {size, sha256}} of every file), after checking the folder against its
    manifest: only what `make publish` wrote and still matches goes to the store."""
    manifest = read_manifest(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict) or not manifest.get("sha256"):
        raise ConfigError(f"{folder}/manifest.json: missing or unreadable; run make publish first")
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = str(path.relative_to(folder))
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    listed = set(manifest["files"]) | {"manifest.json"}
    wrong = sorted(
        [f"{rel}: not in manifest.json" for rel in set(files) - listed]
        + [f"{rel}: missing" for rel in listed - set(files)]
        + [
            f"{rel}: differs from manifest.json"
            for rel, h in manifest["files"].items()
            if isinstance(h, str) and rel in files and files[rel]["sha256"] != h
        ]
    )
    if wrong:
        raise ConfigError(f"{folder}: {'; '.join(wrong)}; publish it again (FORCE_PUBLISH=1) before uploading")
    return manifest, files


def upload(folder: Path, url: str, alias: str = "latest", multipart_mb: int = 64, client=None) -> tuple[str, str, str]:
    """Upload the published folder as version <manifest sha256[:16]>; returns (name, version, where)."""
    bucket, prefix = parse_registry(url)
    manifest, files = folder_files(folder)
    name, version = manifest.get("name") or folder.name, manifest["sha256"][:VERSION_CHARS]
    root = f"{prefix}/{name}" if prefix else name
    where = f"s3://{bucket}/{root}/{version}"
    client = client or s3_client()
    marker = {
        "name": name,
        "version": version,
        "manifest_sha256": manifest["sha256"],
        "files": files,
        "published_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    with store_errors(f"s3://{bucket}"):
        client.head_bucket(Bucket=bucket)
    with store_errors(where):
        existing = get_json(client, bucket, f"{root}/versions/{version}.json")
        if existing is not None:
            _same_or_refuse(client, bucket, root, version, existing, files, where)
            print(f"{where}: already published with the same content; nothing to upload", flush=True)
        else:
            sent, skipped = _upload_objects(client, bucket, root, version, folder, files, multipart_mb)
            if _write_marker(client, bucket, root, marker, where):
                print(f"uploaded {where}/ ({sent} objects, {skipped} already there from an earlier run)", flush=True)
            else:
                print(f"{where}: completed by another publish at the same time; same content", flush=True)
        _move_alias(client, bucket, root, alias, marker)
    return name, version, where


def _upload_objects(client, bucket: str, root: str, version: str, folder: Path, files: dict, multipart_mb: int):
    """Every file not already whole in the store (a killed run's objects are kept); (sent, skipped)."""
    from boto3.s3.transfer import TransferConfig

    transfer = TransferConfig(multipart_threshold=multipart_mb * MIB, multipart_chunksize=multipart_mb * MIB)
    sent = skipped = 0
    # manifest.json last among the files, so a listing of a half upload shows it is not whole
    for rel in sorted(files, key=lambda r: (r == "manifest.json", r)):
        key = f"{root}/{version}/{rel}"
        if object_problem(client, bucket, key, files[rel]) is None:
            skipped += 1
            continue
        extra = {"Metadata": {"sha256": files[rel]["sha256"]}}
        client.upload_file(str(folder / rel), bucket, key, ExtraArgs=extra, Config=transfer)
        sent += 1
    where = f"s3://{bucket}/{root}/{version}"
    if problems := [
        f"{rel}: {p}" for rel in files if (p := object_problem(client, bucket, f"{root}/{version}/{rel}", files[rel]))
    ]:
        raise RegistryError(f"{where}: after the upload {'; '.join(problems)}; run it again")
    return sent, skipped


def _write_marker(client, bucket: str, root: str, marker: dict, where: str) -> bool:
    """The version marker, conditionally (If-None-Match: *): True where this publish wrote it, False where
    another wrote the same content between our check and our write (other content is refused)."""
    from botocore.exceptions import ClientError

    key = f"{root}/versions/{marker['version']}.json"
    try:
        body = json.dumps(marker, indent=1).encode()
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*")
        return True
    except ClientError as e:
        if _status(e)[1] not in (409, 412):
            raise
    found = get_json(client, bucket, key)
    _same_or_refuse(client, bucket, root, marker["version"], found, marker["files"], where)
    return False


def _move_alias(client, bucket: str, root: str, alias: str, marker: dict) -> None:
    """The alias to this version, after its marker; unchanged where it points there already."""
    key = f"{root}/aliases/{alias}.json"
    if (get_json(client, bucket, key) or {}).get("version") == marker["version"]:
        return
    body = {"version": marker["version"], "name": marker["name"], "moved_at": marker["published_at"]}
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")
    print(f"s3://{bucket}/{key}: now {marker['version']}", flush=True)


def _same_or_refuse(client, bucket: str, root: str, version: str, existing: dict | None, files: dict, where: str):
    """A complete version is immutable: the same files (and every object still whole), or a one-line refusal."""
    theirs = (existing or {}).get("files") or {}
    if theirs != files:
        changed = sorted({k for k in set(theirs) | set(files) if theirs.get(k) != files.get(k)})
        raise RegistryError(
            f"{where}: already published with other content ({', '.join(changed)}); versions are immutable, "
            "nothing was uploaded"
        )
    if problems := [
        f"{rel}: {p}" for rel in files if (p := object_problem(client, bucket, f"{root}/{version}/{rel}", files[rel]))
    ]:
        raise RegistryError(
            f"{where}: the store's objects no longer match the version's marker ({'; '.join(problems)}); "
            "something changed them behind the registry: nothing was uploaded"
        )
