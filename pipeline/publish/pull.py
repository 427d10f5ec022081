#!/usr/bin/env python3
"""Pull one published version from an S3 store, verify every file, and rename it into place.

    python3 pull.py s3://bucket/prefix --name <model>-<variant> --version <version|alias> --into DIR
    python3 pull.py s3://bucket/prefix --model <model> --version <version> --into DIR   (finds the name)

Python's standard library only (it runs in the serving image, where nothing is installed): requests are
signed with AWS Signature V4 here, from the standard AWS settings: AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the shared credentials file (AWS_SHARED_CREDENTIALS_FILE,
~/.aws/credentials, profile AWS_PROFILE); AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION /
AWS_DEFAULT_REGION, else the config file (AWS_CONFIG_FILE, ~/.aws/config). No credentials: unsigned
requests (a public bucket). Signing here rather than pre-signed URLs: a pre-signed URL expires (7 days
at most), and an init container that restarts later must still be able to pull.

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
import configparser
import dataclasses
import datetime
import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

CHUNK = 1 << 20
VERSION_CHARS = 16
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class PullError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class TransferPace:
    """How slowly a store may move an object and still be taken for alive: what each request's bound derives
    from (here, and for the uploads of pipeline/publish/registry.py and pipeline/publish/hub.py). One attempt may take
    start_s (the store's own latency, a busy gateway) plus the object's bytes at bytes_per_s, and may go
    start_s without a byte (a stalled connection); a store that does neither is tried `attempts` times."""

    start_s: float
    bytes_per_s: float
    attempts: int
    connect_s: float = 10.0  # a TCP (and TLS) handshake carries no work

    def request_s(self, nbytes: int) -> float:
        return self.start_s + nbytes / self.bytes_per_s

    def each(self, nbytes: int) -> str:
        """One attempt's bound in words."""
        size = f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes:,} bytes"
        moved = f" + {size} at {self.bytes_per_s / 2**20:g} MiB/s" if nbytes else ""
        return f"{self.start_s:g} s{moved}"

    def why(self, nbytes: int) -> str:
        """The bound in words, for the line that gives up."""
        return f"{self.attempts} attempts of {self.each(nbytes)}"


# Slow but alive: the tests' SeaweedFS on loopback gave 100-312 MiB/s (docs/published-files.md) and a store
# across a network tens of MiB/s; 1 MiB/s is a link two orders below that which still moves bytes.
STORE_PACE = TransferPace(start_s=30.0, bytes_per_s=2**20, attempts=3)


# ------------------------------------------------------------------------------- settings, signing
def _profile_section(parser: configparser.ConfigParser, profile: str, config: bool) -> dict:
    name = profile if not config or profile == "default" else f"profile {profile}"
    return dict(parser[name]) if parser.has_section(name) else {}


def aws_settings(environ=os.environ) -> dict:
    """Endpoint, region and credentials, as boto3 would find them in the environment and the files."""
    profile = environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path(environ.get("HOME") or "~").expanduser()
    files = {}
    for key, var, default, config in (
        ("config", "AWS_CONFIG_FILE", home / ".aws/config", True),
        ("credentials", "AWS_SHARED_CREDENTIALS_FILE", home / ".aws/credentials", False),
    ):
        parser = configparser.ConfigParser()
        parser.read(Path(environ.get(var) or default).expanduser())
        files[key] = _profile_section(parser, profile, config)
    cfg, creds = files["config"], {**files["config"], **files["credentials"]}
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or cfg.get("region") or "us-east-1"
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or cfg.get("endpoint_url")
    if environ.get("AWS_ACCESS_KEY_ID"):
        key = (environ["AWS_ACCESS_KEY_ID"], environ.get("AWS_SECRET_ACCESS_KEY", ""), environ.get("AWS_SESSION_TOKEN"))
    elif creds.get("aws_access_key_id"):
        key = (creds["aws_access_key_id"], creds.get("aws_secret_access_key", ""), creds.get("aws_session_token"))
    else:
        key = None
    return {
        "endpoint": (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/"),
        "region": region,
        "credentials": key,
    }


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def signed_request(settings: dict, bucket: str, key: str = "", query: dict | None = None) -> urllib.request.Request:
    """A GET of s3://bucket/key (path-style URL), signed with Signature V4 when there are credentials."""
    base = urllib.parse.urlsplit(settings["endpoint"])
    path = f"{base.path}/{_quote(bucket)}" + (f"/{_quote(key, safe='-_.~/')}" if key else "")
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted((query or {}).items()))
    url = f"{base.scheme}://{base.netloc}{path}" + (f"?{canonical_query}" if canonical_query else "")
    headers = {"host": base.netloc, "x-amz-content-sha256": EMPTY_SHA256}
    creds = settings["credentials"]
    if creds:
        access, secret, token = creds
        now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 (serving images may have Python < 3.11)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers["x-amz-date"] = stamp
        if token:
            headers["x-amz-security-token"] = token
        names = sorted(headers)
        canonical = "\n".join(
            ["GET", path, canonical_query, *(f"{h}:{headers[h]}" for h in names), "", ";".join(names), EMPTY_SHA256]
        )
        scope = f"{day}/{settings['region']}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signing = f"AWS4{secret}".encode()
        for part in (day, settings["region"], "s3", "aws4_request"):
            signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
        )
    return urllib.request.Request(url, headers={k: v for k, v in headers.items() if k != "host"})


def _error_code(err: urllib.error.HTTPError) -> str:
    try:
        root = ET.fromstring(err.read())
        return root.findtext("Code") or str(err.code)
    except ET.ParseError:
        return str(err.code)


def s3_get(settings: dict, bucket: str, key: str = "", query=None, missing_ok=False, read=None, nbytes: int = 0):
    """read(response, deadline) of GET s3://bucket/key (default: its whole body), or None for a missing key
    with missing_ok. nbytes: the object's size, what its bound derives from (STORE_PACE). A failure of the
    connection or a 5xx, a store that does not answer, or one slower than the bound is tried again, up to
    STORE_PACE.attempts in all; everything else, and the last of those, is one-line PullError."""
    where, pace = f"s3://{bucket}/{key}", STORE_PACE
    read = read or read_all
    t0, why = time.monotonic(), ""
    for attempt in range(1, pace.attempts + 1):
        deadline = time.monotonic() + pace.request_s(nbytes)
        try:
            request = signed_request(settings, bucket, key, query)
            # the socket's timeout: a connection that says nothing for start_s is stalled, whatever is left to move
            with urllib.request.urlopen(request, timeout=pace.start_s) as response:
                return read(response, deadline)
        except urllib.error.HTTPError as err:
            code = _error_code(err)
            if code == "NoSuchKey" or (err.code == 404 and code == "404" and missing_ok):
                if missing_ok:
                    return None
                raise PullError(f"{where}: missing from the store") from None
            if code == "NoSuchBucket":
                raise PullError(f"s3://{bucket}: no such bucket at {settings['endpoint']}") from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied") or err.code == 403:
                raise PullError(
                    f"{where}: {code} from {settings['endpoint']}; check AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY (or the profile) and the bucket's policy"
                ) from None
            if err.code < 500:
                raise PullError(f"{where}: HTTP {err.code} {code} from {settings['endpoint']}") from None
            why = f"HTTP {err.code} {code}"
        except (urllib.error.URLError, OSError) as err:  # refused, reset, timed out (TimeoutError is an OSError)
            why = str(getattr(err, "reason", err)) or type(err).__name__
        if attempt < pace.attempts:
            time.sleep(attempt)
    raise PullError(
        f"{where}: not received from the store at {settings['endpoint']} in {time.monotonic() - t0:.0f} s, its "
        f"bound ({pace.why(nbytes)}): {why}; check AWS_ENDPOINT_URL, the network and the store"
    )


def read_all(response, deadline: float) -> bytes:
    """A small reply's body (a marker, an alias, a listing), within its attempt's deadline."""
    body = b""
    while block := response.read1(CHUNK):  # what has come, not all of CHUNK: checked as it streams
        body += block
        if time.monotonic() > deadline:
            raise TimeoutError("slower than its bound")
    return body


def s3_json(settings: dict, bucket: str, key: str, missing_ok: bool = False) -> dict | None:
    body = s3_get(settings, bucket, key, missing_ok=missing_ok)
    if body is None:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        raise PullError(f"s3://{bucket}/{key}: not JSON; the store holds something else there") from None
    if not isinstance(doc, dict):  # a marker and an alias are objects: every later step reads their keys
        raise PullError(f"s3://{bucket}/{key}: not a JSON object; the store holds something else there")
    return doc


def list_names(settings: dict, bucket: str, prefix: str) -> list[str]:
    """The published names (first-level 'folders') under s3://bucket/prefix/."""
    names, token = [], None
    while True:
        query = {"list-type": "2", "delimiter": "/", "prefix": f"{prefix}/" if prefix else ""}
        if token:
            query["continuation-token"] = token
        not_listing = PullError(
            f"s3://{bucket}/{query['prefix']}: the listing from {settings['endpoint']} is not an S3 ListObjectsV2 "
            "reply; check AWS_ENDPOINT_URL"
        )
        try:
            root = ET.fromstring(s3_get(settings, bucket, "", query))
        except ET.ParseError:
            raise not_listing from None
        ns = re.match(r"\{.*\}", root.tag)
        ns = ns.group(0) if ns else ""
        prefixes = [p.findtext(f"{ns}Prefix") for p in root.iter(f"{ns}CommonPrefixes")]
        if not all(prefixes):
            raise not_listing
        names += [p.rstrip("/").rsplit("/", 1)[-1] for p in prefixes]
        token = root.findtext(f"{ns}NextContinuationToken")
        if not token:
            return names


# -------------------------------------------------------------------------------------- the pull
def parse_url(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix without slashes at the ends)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise PullError(f"{url}: not an s3://bucket/prefix URL")
    return parts.netloc, parts.path.strip("/")


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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def version_of(hashes: dict) -> str:
    """A published version's name: the first VERSION_CHARS digits of the hash of every file of the folder
    (path -> sha256), manifest.json included, so that a pinned version is every byte of it: what the
    manifest says (recipe, figures, the choice) as much as the weights. manifest.json's own sha256 is the
    hash of the other files (it cannot hold its own)."""
    return tree_hash(hashes)[:VERSION_CHARS]


def folder_version(folder: Path) -> str:
    """The version a published folder is (version_of over its regular files)."""
    return version_of({rel: sha256_file(folder / rel) for rel in regular_files(folder)[0]})


def tree_hash(hashes: dict) -> str:
    """The hash of a file list with their sha256s, as pipeline/identity.py makes manifest.json's sha256."""
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def regular_files(folder: Path) -> tuple[list[str], list[str]]:
    """(the regular files under `folder` by relative path, a problem for every other entry there: a symlink,
    whatever it points at, a FIFO, a device), links not followed."""
    files, problems = [], []
    for top, dirs, names in os.walk(folder):  # a link to a folder is listed in dirs and not entered
        for name in dirs + names:
            path = Path(top) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                files.append(str(path.relative_to(folder)))
            elif not stat.S_ISDIR(mode):
                what = "a symlink" if stat.S_ISLNK(mode) else "not a file or folder"
                problems.append(f"{path.relative_to(folder)}: {what}, not a regular file")
    return sorted(files), problems


def check_folder(folder: Path, version: str, marker: dict) -> list[str]:
    """Every problem between a folder and the version (empty: it is the version), its files hashed here."""
    present, problems = regular_files(folder)
    if problems:
        return problems
    return content_problems({rel: sha256_file(folder / rel) for rel in present}, folder, version, marker)


def content_problems(found: dict, folder: Path, version: str, marker: dict) -> list[str]:
    """Every problem between the files found in `folder` (path -> sha256) and the version: the marker's
    list, the version's name recomputed from them, then SHA256SUMS and manifest.json (empty: all good)."""
    files = marker.get("files") or {}
    problems = [f"{rel}: not part of version {version}" for rel in sorted(set(found) - set(files))]
    for rel, want in sorted(files.items()):
        if rel not in found:
            problems.append(f"{rel}: missing")
        elif found[rel] != want.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the version's")
    if problems:
        return problems
    for needed in ("manifest.json", "SHA256SUMS"):
        if needed not in found:
            return [f"{needed}: not part of version {version}"]
    # the marker agrees, but it is the store's word: the version's name is what was pinned
    if (got := version_of(found)) != version:
        return [
            f"version {version} is not these files: they hash to {got} (rewritten in the "
            "store with their marker since it was published; nothing was put in place)"
        ]
    content = {rel: h for rel, h in found.items() if rel != "manifest.json"}
    tree = tree_hash(content)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        sums = dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())
    except ValueError as e:  # UnicodeDecodeError and json's errors are ValueErrors
        return [f"manifest.json or SHA256SUMS: unreadable ({e})"]
    if not isinstance(manifest, dict):
        return ["manifest.json: not a JSON object"]
    if manifest.get("sha256") != tree:
        problems.append(f"manifest.json: sha256 {manifest.get('sha256')} is not the hash of the files ({tree})")
    for rel, digest in sorted(sums.items()):
        if found.get(rel) != digest:
            problems.append(f"SHA256SUMS: {rel} does not match the file")
    listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    for rel in sorted(set(listed) | set(content)):
        if listed.get(rel) != content.get(rel):
            problems.append(f"manifest.json: {rel} does not match the file")
    unlisted = set(found) - set(sums) - {"SHA256SUMS", "manifest.json"}
    problems += [f"SHA256SUMS: does not list {rel}" for rel in sorted(unlisted)]
    return problems


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
