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

With the upload come the deployment files that fetch the version (written to <OUT>/deploy/<name>/, not
into the published folder: a file cannot hold the hash of the folder it is part of): k8s.yaml with an
initContainer that runs pull.py into the pod's model volume before vLLM starts, and docker-compose.yml
with a one-shot pull service the server waits for. Credentials come from a Secret / the environment,
never from a file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import sys
import urllib.parse
from pathlib import Path

import yaml

from pipeline.artifacts import read_manifest, sha256_file, staging_dir
from pipeline.schema import ConfigError

PULLER = Path(__file__).with_name("pull.py")
VERSION_CHARS = 16  # as pull.py's
MIB = 2**20
PULL_MOUNT = "/model-store"  # where the pull step sees the model volume; vLLM sees one version of it at /model


class RegistryError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ the store
def parse_registry(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix); other schemes are one line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("hf", "oci"):
        raise ConfigError(
            f"REGISTRY={url}: {parts.scheme}:// is not supported yet (docs/published-files.md); use s3://bucket/prefix"
        )
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"REGISTRY={url}: expected s3://bucket/prefix")
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
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    bucket, prefix = parse_registry(url)
    manifest, files = folder_files(folder)
    name, version = manifest.get("name") or folder.name, manifest["sha256"][:VERSION_CHARS]
    root = f"{prefix}/{name}" if prefix else name
    where = f"s3://{bucket}/{root}/{version}"
    client = client or s3_client()
    marker_key, alias_key = f"{root}/versions/{version}.json", f"{root}/aliases/{alias}.json"
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
        existing = get_json(client, bucket, marker_key)
        if existing is not None:
            _same_or_refuse(client, bucket, root, version, existing, files, where)
            print(f"{where}: already published with the same content; nothing to upload", flush=True)
        else:
            transfer = TransferConfig(multipart_threshold=multipart_mb * MIB, multipart_chunksize=multipart_mb * MIB)
            sent = skipped = 0
            # manifest.json last among the files, so a listing of a half upload shows it is not whole
            for rel in sorted(files, key=lambda r: (r == "manifest.json", r)):
                key = f"{root}/{version}/{rel}"
                if object_problem(client, bucket, key, files[rel]) is None:
                    skipped += 1  # a killed run's object, already whole
                    continue
                client.upload_file(
                    str(folder / rel),
                    bucket,
                    key,
                    ExtraArgs={"Metadata": {"sha256": files[rel]["sha256"]}},
                    Config=transfer,
                )
                sent += 1
            if problems := [
                f"{rel}: {p}"
                for rel in files
                if (p := object_problem(client, bucket, f"{root}/{version}/{rel}", files[rel]))
            ]:
                raise RegistryError(f"{where}: after the upload {'; '.join(problems)}; run it again")
            try:
                client.put_object(
                    Bucket=bucket,
                    Key=marker_key,
                    Body=json.dumps(marker, indent=1).encode(),
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
                print(f"uploaded {where}/ ({sent} objects, {skipped} already there from an earlier run)", flush=True)
            except ClientError as e:
                if _status(e)[1] not in (409, 412):
                    raise
                # another publish wrote the marker between our check and our write
                _same_or_refuse(client, bucket, root, version, get_json(client, bucket, marker_key), files, where)
                print(f"{where}: completed by another publish at the same time; same content", flush=True)
        current = get_json(client, bucket, alias_key)
        if (current or {}).get("version") != version:
            body = {"version": version, "name": name, "moved_at": marker["published_at"]}
            client.put_object(
                Bucket=bucket, Key=alias_key, Body=json.dumps(body).encode(), ContentType="application/json"
            )
            print(f"s3://{bucket}/{alias_key}: now {version}", flush=True)
    return name, version, where


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


# ------------------------------------------------------------------------ deployment files that pull
def pull_command(url: str, name: str, version: str) -> list[str]:
    return ["python3", "/pull/pull.py", url, "--name", name, "--version", version, "--into", f"{PULL_MOUNT}/{version}"]


def k8s_with_pull(objects: list[dict], url: str, name: str, version: str, size_bytes: int) -> list[dict]:
    """The published k8s objects with the model volume filled by an initContainer that pulls and verifies
    the version (vLLM starts only after it exits 0); pull.py from a ConfigMap, credentials from a Secret."""
    objects = json.loads(json.dumps(objects))
    deployment = next(o for o in objects if o.get("kind") == "Deployment")
    app = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    for mount in vllm["volumeMounts"]:
        if mount["name"] == "model":
            mount["subPath"] = version  # vLLM sees exactly the pulled version at /model
    limit = f"{math.ceil(size_bytes * 1.1 / 2**30) + 1}Gi"  # the version, and room for the pull's temporary folder
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "model"] + [
        {"name": "model", "emptyDir": {"sizeLimit": limit}},
        {"name": "puller", "configMap": {"name": f"{app}-pull"}},
    ]
    pod["initContainers"] = [
        {
            "name": "pull",
            "image": vllm["image"],  # has python3; pull.py needs nothing else
            "command": pull_command(url, name, version),
            # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, where needed, AWS_ENDPOINT_URL, AWS_REGION
            "envFrom": [{"secretRef": {"name": f"{app}-registry"}}],
            "volumeMounts": [
                {"name": "model", "mountPath": PULL_MOUNT},
                {"name": "puller", "mountPath": "/pull", "readOnly": True},
            ],
        }
    ]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{app}-pull", "labels": {"app": app}},
        "data": {"pull.py": PULLER.read_text()},
    }
    return [config_map, *objects]


def compose_with_pull(compose: dict, url: str, name: str, version: str) -> dict:
    """The published compose file with a one-shot pull service into a named volume; the server starts after
    it completes successfully and serves that version read-only."""
    compose = json.loads(json.dumps(compose))
    (service,) = compose["services"]  # the one server the published file has
    server = compose["services"][service]
    server["volumes"] = [v for v in server["volumes"] if not v.endswith(":/model:ro")] + ["model:/model:ro"]
    server["working_dir"] = f"/model/{version}"
    server["command"] = [f"/model/{version}/serve.yaml" if a == "/model/serve.yaml" else a for a in server["command"]]
    server["depends_on"] = {"pull": {"condition": "service_completed_successfully"}}
    env = {k: f"${{{k}:?set {k}}}" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env |= {k: f"${{{k}:-}}" for k in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION")}
    pull = {
        "image": server["image"],
        "entrypoint": pull_command(url, name, version)[:2],
        "command": pull_command(url, name, version)[2:],
        "volumes": ["./pull.py:/pull/pull.py:ro", f"model:{PULL_MOUNT}"],
        "environment": env,
        "restart": "no",
    }
    return {**compose, "services": {"pull": pull, **compose["services"]}, "volumes": {"model": {}}}


def write_deploy(folder: Path, out: Path, url: str, name: str, version: str) -> Path:
    """<out>/<name>/: k8s.yaml, docker-compose.yml, pull.py and a README, made from the published folder's
    own deployment files; replaced whole on every publish (they follow the version, which is immutable)."""
    dest = out / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    objects = [o for o in yaml.safe_load_all((folder / "k8s.yaml").read_text()) if o]
    compose = yaml.safe_load((folder / "docker-compose.yml").read_text())
    app = next(o for o in objects if o.get("kind") == "Deployment")["metadata"]["name"]
    with staging_dir(dest) as tmp:
        (tmp / "k8s.yaml").write_text(
            f"# {name}, version {version} from {url}: kubectl apply -f k8s.yaml (registry credentials in secret "
            f"{app}-registry, API key in secret {app}-api-key)\n"
            + yaml.safe_dump_all(k8s_with_pull(objects, url, name, version, size), sort_keys=False)
        )
        (tmp / "docker-compose.yml").write_text(
            f"# {name}, version {version} from {url}: `docker compose up` from this folder, with "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a store other than AWS) set\n"
            + yaml.safe_dump(compose_with_pull(compose, url, name, version), sort_keys=False)
        )
        (tmp / "pull.py").write_text(PULLER.read_text())
        (tmp / "README.md").write_text(
            f"# {name} from {url}, version {version}\n\n"
            "Deployment files that pull the published version and verify every file (SHA256SUMS, manifest.json)\n"
            "before vLLM starts; a tampered or missing object stops the pull and nothing is served.\n\n"
            "```bash\n"
            f"kubectl create secret generic {app}-registry --from-literal=AWS_ACCESS_KEY_ID=... \\\n"
            "  --from-literal=AWS_SECRET_ACCESS_KEY=... [--from-literal=AWS_ENDPOINT_URL=...]\n"
            f"kubectl create secret generic {app}-api-key --from-literal=api-key=$VLLM_API_KEY\n"
            "kubectl apply -f k8s.yaml\n"
            "docker compose up                    # AWS_* and VLLM_API_KEY in the environment\n"
            f"python3 pull.py {url} --name {name} --version {version} --into DIR   # by hand\n"
            "```\n"
        )
    return dest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a published folder (artifacts/published/<model>-<variant>)")
    p.add_argument("registry", help="s3://bucket/prefix")
    p.add_argument("--deploy-out", type=Path, help="where the deployment files go (default: <folder>/../../deploy)")
    p.add_argument("--alias", default="latest")
    p.add_argument("--multipart-mb", type=int, default=64, help="files larger than this go up in parts this size")
    args = p.parse_args(argv)
    try:
        publish_to_registry(args.folder, args.registry, args.deploy_out, args.alias, args.multipart_mb)
        return 0
    except (ConfigError, RegistryError) as e:
        print(f"publish: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1


def publish_to_registry(
    folder: Path, url: str, deploy_out: Path | None = None, alias: str = "latest", multipart_mb: int = 64
) -> Path:
    """Upload, then the deployment files that pull what was uploaded."""
    name, version, where = upload(folder, url, alias, multipart_mb)
    deploy = write_deploy(folder, deploy_out or folder.parent.parent / "deploy", url, name, version)
    print(f"version {version}; deployment files that pull it: {deploy}/ (k8s.yaml, docker-compose.yml)", flush=True)
    return deploy


if __name__ == "__main__":
    sys.exit(main())
