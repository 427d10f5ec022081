"""Pull one published version from an S3 store, verify every file, and rename it into place.

    python3 pipeline/publish/puller s3://bucket/prefix --name <model>-<variant> --version <version|alias> --into DIR
    python3 pipeline/publish/puller s3://bucket/prefix --model <model> --version <version> --into DIR   (finds the name)

Python's standard library only: it runs in the serving image, where nothing is installed, as a folder of three
modules (a deployment's ConfigMap or volume holds them; `python3 /pull ...`): this one (the pull), s3_reads.py
(GETs signed with AWS Signature V4 from the standard AWS settings: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, else the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials, profile
AWS_PROFILE); AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION / AWS_DEFAULT_REGION, else the config file
(AWS_CONFIG_FILE, ~/.aws/config); no credentials: unsigned requests, a public bucket) and version_files.py (what a
version is, file by file).

The layout `pipeline/publish/registry.py` writes (<version>: the first 16 hex digits of the hash of every
file, manifest.json included):
    <prefix>/<name>/<version>/<file>             every file of the published folder
    <prefix>/<name>/versions/<version>.json      the version marker, written last: {files: {path: {size, sha256}}}
    <prefix>/<name>/aliases/<alias>.json         {"version": ...}, moved after the version is complete

Every request is bounded (TransferPace): a store that accepts and never answers, or sends an object slower
than a slow link would, is retried and then given up on in one line naming the object, the store and how
long it waited.

Files go to a temporary folder beside DIR; each must match the marker (size, sha256), and the version's
name is recomputed from the files received (the hash of every file's sha256 but manifest.json's, as
manifest.json's sha256 is made): whoever can write the store can rewrite the marker, SHA256SUMS and
manifest.json to agree with other files, but not the name a deployment pinned. Then SHA256SUMS and
manifest.json must agree with the files; only then is the folder renamed to DIR. Any problem is one
line on stderr, exit 1, and DIR is not created. DIR already holding that version (checked file by file;
regular files only: a symlink is not the version's bytes, and a copy of the folder would dangle) is left
as it is.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__:  # imported (make's stages, the tests): the package's modules
    from pipeline.publish.puller.s3_reads import CHUNK, PullError, aws_settings, list_names, parse_url, s3_get, s3_json
    from pipeline.publish.puller.version_files import VERSION_CHARS, check_folder, content_problems
else:  # run as a folder (python3 /pull), as a deployment does: its modules are top-level there
    from s3_reads import CHUNK, PullError, aws_settings, list_names, parse_url, s3_get, s3_json
    from version_files import VERSION_CHARS, check_folder, content_problems


def resolve(settings: dict, bucket: str, prefix: str, name: str | None, model: str | None, version: str):
    """(name, version name, marker) of a version or an alias; with no name, the one name under the prefix
    (starting with `model-`) that holds it."""
    base = f"{prefix}/" if prefix else ""
    if name is None:
        names = [n for n in list_names(settings, bucket, prefix) if model is None or n.startswith(f"{model}-")]
        found = [n for n in names if _find(settings, bucket, f"{base}{n}", version) is not None]
        if len(found) != 1:
            raise PullError(
                f"s3://{bucket}/{base}: {len(found)} published names hold version {version!r} "
                f"({', '.join(found) or 'none of ' + str(names or 'no names')}); name one with --name"
            )
        name = found[0]
    hit = _find(settings, bucket, f"{base}{name}", version)
    if hit is None:
        raise PullError(
            f"s3://{bucket}/{base}{name}: no complete version or alias {version!r} (an upload that did not "
            "finish has no marker and is not a version)"
        )
    return (name, *hit)


def check_marker(marker, where: str) -> dict:
    """The marker, where it has the shape pipeline/publish/registry.py writes ({files: {path: {size, sha256}}}), else
    a one-line PullError (another writer's marker; every later step reads these keys)."""
    files = marker.get("files") if isinstance(marker, dict) else None
    shape = f"{where}: not a version marker pipeline/publish/registry.py writes ({{files: {{path: {{size, sha256}}}}}})"
    if not isinstance(files, dict) or not all(
        isinstance(f, dict) and type(f.get("size")) is int and isinstance(f.get("sha256"), str) for f in files.values()
    ):
        raise PullError(shape)
    for rel, f in files.items():
        if f["size"] < 0:
            raise PullError(f"{shape}: {rel!r} has size {f['size']}")
        # a file's path as the registry lists it: parts joined by '/', none empty or '.' (a '..' or an absolute
        # path is named as outside the folder, by pull)
        if ".." not in Path(rel).parts and not Path(rel).is_absolute() and any(p in ("", ".") for p in rel.split("/")):
            raise PullError(f"{shape}: lists {rel!r}, not a file's path inside the folder")
    return marker


def _find(settings: dict, bucket: str, root: str, version: str):
    if re.fullmatch(rf"[0-9a-f]{{{VERSION_CHARS}}}", version):
        key = f"{root}/versions/{version}.json"
        marker = s3_json(settings, bucket, key, missing_ok=True)
        return None if marker is None else (version, check_marker(marker, f"s3://{bucket}/{key}"))
    if not re.fullmatch(r"[A-Za-z0-9._-]+", version):
        raise PullError(f"version {version!r}: a version ({VERSION_CHARS} hex digits) or an alias name")
    key = f"{root}/aliases/{version}.json"
    alias = s3_json(settings, bucket, key, missing_ok=True)
    if alias is None:
        return None
    target = alias.get("version")
    if not isinstance(target, str) or not re.fullmatch(rf"[0-9a-f]{{{VERSION_CHARS}}}", target):
        raise PullError(
            f"s3://{bucket}/{key}: names {target!r}, not a version ({VERSION_CHARS} hex digits); an alias points "
            "at a version"
        )
    return _find(settings, bucket, root, target)


def pull(
    url: str,
    version: str,
    into: Path | None = None,
    name: str | None = None,
    model: str | None = None,
    under: Path | None = None,
    settings=None,
) -> Path:
    """Pull into `into`, or into `under`/<name>-<version>."""
    settings = settings or aws_settings()
    bucket, prefix = parse_url(url)
    name, version, marker = resolve(settings, bucket, prefix, name, model, version)
    into = into if into is not None else under / f"{name}-{version}"
    root = f"{prefix}/{name}/{version}" if prefix else f"{name}/{version}"
    where = f"s3://{bucket}/{root}"
    if into.exists() or into.is_symlink():
        problems = ["a symlink"] if into.is_symlink() else ["not a folder"] if not into.is_dir() else []
        if not (problems := problems or check_folder(into, version, marker)):
            print(f"{into}: already holds {where}; nothing to do", flush=True)
            return into
        raise PullError(
            f"{into}: exists and is not version {version} of {name} ({'; '.join(problems[:3])}); remove it or "
            "pull --into elsewhere"
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".pull-{into.name}-", dir=into.parent))
    t0, total, received = time.time(), 0, {}
    try:
        for rel, want in sorted(marker.get("files", {}).items()):
            path = tmp / rel
            if ".." in Path(rel).parts or Path(rel).is_absolute():
                raise PullError(f"{where}: the marker lists {rel!r}, outside the folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            size, digest = s3_get(settings, bucket, f"{root}/{rel}", read=receive_into(path), nbytes=want["size"])
            if size != want["size"] or digest.hexdigest() != want["sha256"]:
                raise PullError(
                    f"{where}/{rel}: {size} bytes, sha256 {digest.hexdigest()[:16]}…: not the published file"
                )
            total += size
            received[rel] = digest.hexdigest()
        if problems := content_problems(received, tmp, version, marker):
            raise PullError(f"{where}: {'; '.join(problems)}")
        tmp.chmod(0o755)
        tmp.rename(into)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            need = sum(f.get("size", 0) for f in marker.get("files", {}).values())
            raise PullError(
                f"{into.parent}: {e.strerror.lower()} while pulling {where}: "
                f"{shutil.disk_usage(into.parent).free / 2**20:.1f} MiB free there now, the version needs "
                f"{need / 2**20:.1f} MiB; nothing is created and the partial download is removed"
            ) from None
        raise
    print(f"pulled {where} -> {into} ({total / 2**20:.1f} MiB in {time.time() - t0:.1f} s, every file verified)")
    return into


def receive_into(path: Path):
    """s3_get's reader of an object into `path`, hashed as it streams: (size, sha256); each attempt starts
    the file anew."""

    def receive(response, deadline: float):
        digest, size = hashlib.sha256(), 0
        with path.open("wb") as out:
            while block := response.read1(CHUNK):  # what has come, not all of CHUNK: checked as it streams
                digest.update(block)
                size += len(block)
                out.write(block)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slower than its bound after {size} bytes")
        return size, digest

    return receive


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="s3://bucket/prefix, as given to make publish REGISTRY=")
    p.add_argument("--version", required=True, help=f"a version ({VERSION_CHARS} hex digits) or an alias (latest)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--into", type=Path, help="the folder to create")
    where.add_argument("--under", type=Path, help="create <under>/<name>-<version>")
    p.add_argument("--name", help="<model>-<variant>; unset: the one name under the prefix holding the version")
    p.add_argument("--model", help="with no --name: only names starting with <model>-")
    args = p.parse_args(argv)
    # Ctrl-C and SIGTERM (a pod stopped) take one way out, whose `except` removes the partial download.
    # The stages' pipeline/exits.py does this for them; this file runs alone, in the serving image.
    if threading.current_thread() is threading.main_thread():  # only there can Python take a signal
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        pull(args.url, args.version, args.into, args.name, args.model, args.under)
        return 0
    except PullError as e:
        print(f"pull: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit) as e:
        code = 143 if isinstance(e, SystemExit) else 130
        why = "stopped (SIGTERM)" if code == 143 else "interrupted (Ctrl-C)"
        print(
            f"pull: {why} while pulling {args.url} version {args.version}; nothing is created: a pull is moved in "
            "only once every file is verified, and the partial download is removed",
            file=sys.stderr,
        )
        return code


if __name__ == "__main__":
    sys.exit(main())
