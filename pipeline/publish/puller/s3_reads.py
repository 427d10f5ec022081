"""The puller's reads of an S3 store (pipeline/publish/puller/): endpoint, region and credentials as boto3 finds
them, AWS Signature V4 signing, and GETs bounded by TransferPace. Python's standard library only.

Signing here rather than pre-signed URLs: a pre-signed URL expires (7 days at most), and an init container that
restarts later must still be able to pull."""

from __future__ import annotations

import configparser
import dataclasses
import datetime
import hashlib
import hmac
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

CHUNK = 1 << 20
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


def parse_url(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix without slashes at the ends)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise PullError(f"{url}: not an s3://bucket/prefix URL")
    return parts.netloc, parts.path.strip("/")
