"""The published folder in an object store: `make publish REGISTRY=s3://bucket/prefix` uploads it as an
immutable version; `make pull` / `make verify-published REGISTRY=...` and the deployment files fetch it
back with pipeline/publish/puller/ (standard library only), which also documents the layout:

    <prefix>/<name>/<version>/<file>             every file of the published folder, byte for byte
    <prefix>/<name>/versions/<version>.json      the version marker, written last
    <prefix>/<name>/aliases/latest.json          moved to a version only once its marker is there

<version> is the first 16 hex digits of the hash of every file of the folder, manifest.json included
(version_files.version_of), so it names every byte of it. Until
its marker exists a version is invisible (the puller and this module read the marker first), so an upload
killed half-way leaves nothing a deployment can pull; the next run skips the objects already there whose
bytes are the file's (object_problem: the ETag where it is their MD5, else the object's sha256 streamed;
each object also carries its sha256 as metadata, which any writer can keep) and uploads the rest. The
marker is written with If-None-Match: * (a conditional write: of two publishes at once, one writes it;
the other finds it and compares), and a marker with other content under the same version is refused.
Publishing to a complete version checks every object's bytes the same way: one that differs is refused,
or re-uploaded from the folder with repair (FORCE_PUBLISH=1), whose files are the version's content.

Every request of the store is bounded by s3_reads.STORE_PACE, as the puller's are: botocore's connect and read
timeouts and its attempts derive from the bytes a request moves (a part of the object, or none), and a
store that accepts and never answers is given up on in one line naming the object, the store and how
long it waited (`bounded`).

boto3 takes the endpoint, region and credentials from the standard AWS environment variables and files
(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws/config, ...), so AWS S3, MinIO,
Ceph RGW and SeaweedFS all work.

REGISTRY=hf://org/name, the second target, is hub.py's; upload.py picks one of the two for REGISTRY. The
deployment files that pull a version are pull_deploy.py's.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import re
import time
import urllib.parse
from pathlib import Path

from pipeline.artifacts import read_manifest
from pipeline.checkpoint_files import non_regular_files, sha256_file
from pipeline.identity import tree_hash
from pipeline.publish.puller import s3_reads, version_files
from pipeline.schema import ConfigError
from pipeline.setting_values import registry_problem

MIB = 2**20


class RegistryError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ the store
def parse_registry(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix); other schemes are one line (hf:// is pipeline/publish/hub.py's)."""
    parts = urllib.parse.urlsplit(url)
    if (problem := registry_problem(url)) or parts.scheme != "s3":  # the form make checks too
        raise ConfigError(problem or f"REGISTRY={url}: expected s3://bucket/prefix or hf://org/name")
    return parts.netloc, parts.path.strip("/")


def s3_client(nbytes: int = 0):
    """A client whose requests move at most `nbytes` each: the store may take as long to answer as to
    receive them at the pace's rate (a PUT is answered once its body is stored), and is tried
    STORE_PACE.attempts times in all ("standard" retries: throttling, 5xx, timeouts, dropped connections)."""
    import boto3
    from botocore.config import Config

    pace = s3_reads.STORE_PACE
    config = Config(
        connect_timeout=pace.connect_s,
        read_timeout=pace.request_s(nbytes),
        retries={"total_max_attempts": pace.attempts, "mode": "standard"},
    )
    # a new session: the default one keeps the credentials it found first, for the life of the process
    return boto3.session.Session().client("s3", config=config)


@contextlib.contextmanager
def bounded(client, where: str, nbytes: int = 0):
    """One operation on the object `where` (s3://bucket/key) of `nbytes`: where the store did not answer
    within the client's bound, one line naming the object, the store and how long it waited."""
    from botocore.exceptions import ConnectionError as NotConnected
    from botocore.exceptions import HTTPClientError

    t0 = time.monotonic()
    try:
        yield
    except (NotConnected, HTTPClientError) as e:  # timeouts, refused or dropped connections, after the retries
        raise gave_up(client, where, time.monotonic() - t0, s3_reads.STORE_PACE.why(nbytes), str(e)) from None


def gave_up(client, where: str, waited_s: float, bound: str, why: str) -> RegistryError:
    return RegistryError(
        f"{where}: no answer from the store at {client.meta.endpoint_url} in {waited_s:.0f} s, its bound "
        f"({bound}): {why}; check AWS_ENDPOINT_URL, the network and the store"
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
        with bounded(client, f"s3://{bucket}/{key}"):
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        code, status = _status(e)
        if code in ("NoSuchKey", "404") or status == 404:
            return None
        raise
    try:
        doc = json.loads(body)
    except ValueError:
        raise RegistryError(f"s3://{bucket}/{key}: not JSON; something else writes there") from None
    if not isinstance(doc, dict):  # a marker and an alias are objects: their keys are read next
        raise RegistryError(f"s3://{bucket}/{key}: not a JSON object; something else writes there")
    return doc


def head_object(client, bucket: str, key: str) -> dict | None:
    """HEAD of the object, None where there is none."""
    from botocore.exceptions import ClientError

    try:
        with bounded(client, f"s3://{bucket}/{key}"):
            return client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        code, status = _status(e)
        if code in ("NoSuchKey", "404") or status == 404:
            return None
        raise


def head_problem(head: dict | None, want: dict) -> str | None:
    """What a HEAD shows wrong with the object against the file `want` describes ({size, sha256}): missing,
    its size, its sha256 metadata. Whoever rewrites an object can keep both, so this is no proof of bytes."""
    if head is None:
        return "missing"
    if head["ContentLength"] != want["size"]:
        return f"{head['ContentLength']} bytes, the file has {want['size']}"
    if head.get("Metadata", {}).get("sha256") != want["sha256"]:
        return "its sha256 metadata is not the file's"
    return None


def etag_md5(head: dict) -> str | None:
    """The MD5 of the object's bytes where its ETag is that: a single-part upload not encrypted with
    SSE-KMS or a customer key. A multipart ETag is '<MD5 of the parts' MD5s>-<parts>'; an SSE-KMS or SSE-C
    one is not derived from the bytes."""
    if str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or head.get("SSECustomerAlgorithm"):
        return None
    etag = head.get("ETag", "").strip('"')
    return etag if re.fullmatch(r"[0-9a-f]{32}", etag) else None


def file_md5(path: Path) -> str:
    # compared with an ETag the store computed from the bytes it holds, of a file whose bytes we chose
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while block := f.read(MIB):
            digest.update(block)
    return digest.hexdigest()


def object_sha256(client, bucket: str, key: str, size: int) -> str:
    """The sha256 of the object's `size` bytes, streamed from the store within their bound."""
    where, digest, t0 = f"s3://{bucket}/{key}", hashlib.sha256(), time.monotonic()
    with bounded(client, where, size):
        for block in client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(MIB):
            digest.update(block)
            if (waited := time.monotonic() - t0) > s3_reads.STORE_PACE.request_s(size):  # bytes, but too slowly
                raise gave_up(client, where, waited, f"{s3_reads.STORE_PACE.each(size)}, streamed once", "too slow")
    return digest.hexdigest()


def object_problem(client, bucket: str, key: str, want: dict, local: Path) -> str | None:
    """Why the object is not the file `want` describes ({size, sha256}, its bytes at `local`), or None when
    it is: the HEAD's checks, then its bytes, by the ETag where the store made that their MD5, else (or
    where the ETag differs: some stores' ETags are not the MD5 even of a single part) by their sha256
    streamed."""
    head = head_object(client, bucket, key)
    if problem := head_problem(head, want):
        return problem
    md5 = etag_md5(head)
    if md5 is not None and md5 == file_md5(local):
        return None
    got = object_sha256(client, bucket, key, want["size"])
    if got != want["sha256"]:
        return f"its bytes are not the file's (sha256 {got[:16]}…, the file's {want['sha256'][:16]}…)"
    return None


# ---------------------------------------------------------------------------------- the upload
def content_hash(files: dict) -> str:
    """The hash of a published folder's files ({path: {size, sha256}}) as its manifest.json's sha256 is
    made: of every file's sha256 but manifest.json's own (the version is of all of them: version)."""
    return tree_hash({rel: f["sha256"] for rel, f in files.items() if rel != "manifest.json"})


def version_of_files(files: dict) -> str:
    """The version a folder's files ({path: {size, sha256}}) are published as (version_files.version_of: every file,
    manifest.json included), which the puller recomputes from the files it receives."""
    return version_files.version_of({rel: f["sha256"] for rel, f in files.items()})


def folder_files(folder: Path) -> tuple[dict, dict]:
    """(manifest.json, {path: {size, sha256}} of every file), after checking the folder against its
    manifest: only what `make publish` wrote and still matches goes to the store."""
    manifest = read_manifest(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict) or not manifest.get("sha256"):
        raise ConfigError(f"{folder}/manifest.json: missing or unreadable; run make publish first")
    # before any hashing: a link uploads its target's bytes, but the folder itself is not the version
    if odd := non_regular_files(folder):
        raise ConfigError(
            f"{folder}: {'; '.join(f'{rel}: {what}, not a regular file' for rel, what in odd.items())}; a "
            "published folder holds the bytes themselves: publish it again (FORCE_PUBLISH=1) before uploading"
        )
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
    if not wrong and manifest["sha256"] != (found := content_hash(files)):
        # the version is named from it: it must be the hash of the files that go up
        wrong = [f"manifest.json: sha256 {manifest['sha256'][:16]}… is not the hash of the files ({found[:16]}…)"]
    if wrong:
        raise ConfigError(f"{folder}: {'; '.join(wrong)}; publish it again (FORCE_PUBLISH=1) before uploading")
    return manifest, files


def upload(
    folder: Path, url: str, alias: str = "latest", multipart_mb: int = 64, client=None, repair: bool = False
) -> tuple[str, str, str]:
    """Upload the published folder as its version (every file's hash); returns (name, version, where). With
    repair, objects of an existing version whose bytes are not the folder's are uploaded again."""
    bucket, prefix = parse_registry(url)
    manifest, files = folder_files(folder)
    name, version = manifest.get("name") or folder.name, version_of_files(files)
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
    store = Store(client, bucket, root, version, folder, multipart_mb)
    with store_errors(f"s3://{bucket}"), bounded(client, f"s3://{bucket}"):
        client.head_bucket(Bucket=bucket)
    with store_errors(where):
        existing = get_json(client, bucket, f"{root}/versions/{version}.json")
        if existing is not None:
            print(f"{where}: already published {_check_version(store, existing, files, repair)}", flush=True)
        else:
            sent, skipped = _upload_objects(store, files)
            if _write_marker(store, marker):
                print(f"uploaded {where}/ ({sent} objects, {skipped} already there from an earlier run)", flush=True)
            else:
                print(f"{where}: completed by another publish at the same time; same content", flush=True)
        _move_alias(client, bucket, root, alias, marker)
    return name, version, where


class Store:
    """Where one version's objects go, and the folder whose files they are."""

    def __init__(self, client, bucket: str, root: str, version: str, folder: Path, multipart_mb: int):
        from boto3.s3.transfer import TransferConfig

        self.client, self.bucket, self.root, self.version, self.folder = client, bucket, root, version, folder
        self.transfer = TransferConfig(multipart_threshold=multipart_mb * MIB, multipart_chunksize=multipart_mb * MIB)
        self.where = f"s3://{bucket}/{root}/{version}"
        self.part_bytes = multipart_mb * MIB
        self.uploaders: dict[int, object] = {}  # a client for each size of request the upload sends

    def key(self, rel: str) -> str:
        return f"{self.root}/{self.version}/{rel}"

    def problem(self, rel: str, want: dict) -> str | None:
        """Why the object of `rel` is not its file's bytes (object_problem), None when it is."""
        return object_problem(self.client, self.bucket, self.key(rel), want, self.folder / rel)

    def put(self, rel: str, want: dict) -> None:
        """The file into its object: in one PUT, or in parts of multipart_mb where larger, each request
        bounded by the bytes it carries."""
        request_bytes = min(want["size"], self.part_bytes)
        if request_bytes not in self.uploaders:
            self.uploaders[request_bytes] = s3_client(request_bytes)
        client = self.uploaders[request_bytes]
        extra = {"Metadata": {"sha256": want["sha256"]}}
        with bounded(client, f"s3://{self.bucket}/{self.key(rel)}", request_bytes):
            client.upload_file(
                str(self.folder / rel), self.bucket, self.key(rel), ExtraArgs=extra, Config=self.transfer
            )

    def check_sent(self, files: dict, when: str) -> None:
        """After this run's own uploads: each object is there with the file's size and sha256 metadata. Its
        bytes are not read back (that would double a publish); the puller hashes every byte anyway."""
        heads = {
            rel: head_problem(head_object(self.client, self.bucket, self.key(rel)), want) for rel, want in files.items()
        }
        if problems := [f"{rel}: {p}" for rel, p in heads.items() if p]:
            raise RegistryError(f"{self.where}: {when} {'; '.join(problems)}; run it again")


def _upload_objects(store: Store, files: dict) -> tuple[int, int]:
    """Every file whose bytes are not already in the store (a killed run's objects are kept where they
    are the file's); (sent, skipped)."""
    sent = skipped = 0
    # manifest.json last among the files, so a listing of a half upload shows it is not whole
    for rel in sorted(files, key=lambda r: (r == "manifest.json", r)):
        if store.problem(rel, files[rel]) is None:
            skipped += 1
            continue
        store.put(rel, files[rel])
        sent += 1
    store.check_sent(files, "after the upload")
    return sent, skipped


def _write_marker(store: Store, marker: dict) -> bool:
    """The version marker, conditionally (If-None-Match: *): True where this publish wrote it, False where
    another wrote the same content between our check and our write (other content is refused)."""
    from botocore.exceptions import ClientError

    key = f"{store.root}/versions/{marker['version']}.json"
    try:
        body = json.dumps(marker, indent=1).encode()
        with bounded(store.client, f"s3://{store.bucket}/{key}"):
            store.client.put_object(
                Bucket=store.bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*"
            )
        return True
    except ClientError as e:
        if _status(e)[1] not in (409, 412):
            raise
    _check_version(store, get_json(store.client, store.bucket, key), marker["files"], repair=False)
    return False


def _move_alias(client, bucket: str, root: str, alias: str, marker: dict) -> None:
    """The alias to this version, after its marker; unchanged where it points there already."""
    key = f"{root}/aliases/{alias}.json"
    if (get_json(client, bucket, key) or {}).get("version") == marker["version"]:
        return
    body = {"version": marker["version"], "name": marker["name"], "moved_at": marker["published_at"]}
    with bounded(client, f"s3://{bucket}/{key}"):
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")
    print(f"s3://{bucket}/{key}: now {marker['version']}", flush=True)


def _check_version(store: Store, existing: dict | None, files: dict, repair: bool) -> str:
    """A complete version is immutable: its marker must list these files, and every object must hold its
    file's bytes. An object that does not is refused, or with repair uploaded again from the folder (whose
    files hash to the version's name, so they are its content). Returns what was done, for the log."""
    theirs = (existing or {}).get("files")
    theirs = theirs if isinstance(theirs, dict) else {}  # another tool's marker: other content
    if theirs != files:
        changed = sorted({k for k in set(theirs) | set(files) if theirs.get(k) != files.get(k)})
        raise RegistryError(
            f"{store.where}: already published with other content ({', '.join(changed)}); versions are immutable, "
            f"nothing was uploaded{_unnamed(theirs, store.version)}"
        )
    problems = {rel: p for rel, want in files.items() if (p := store.problem(rel, want))}
    if not problems:
        return "with the same content; nothing to upload (every object's bytes checked)"
    listed = "; ".join(f"{rel}: {p}" for rel, p in problems.items())
    if not repair:
        raise RegistryError(
            f"{store.where}: the store's objects are not the version's files ({listed}); something changed them "
            f"behind the registry: nothing was uploaded (FORCE_PUBLISH=1 uploads them again from {store.folder})"
        )
    for rel in problems:
        store.put(rel, files[rel])
    store.check_sent({rel: files[rel] for rel in problems}, "after the repair")
    return f"with the same content; repaired: uploaded {', '.join(problems)} again ({listed})"


def _unnamed(marker_files: dict, version: str) -> str:
    """Where a marker's files do not hash to the version it is filed under, a clause saying so."""
    if not all(isinstance(f, dict) and isinstance(f.get("sha256"), str) for f in marker_files.values()):
        return "; that marker is not one this registry writes"
    got = version_of_files(marker_files)
    return (
        ""
        if got == version
        else f"; that marker's files hash to {got}, not to {version}: it was changed behind the registry"
    )
