"""REGISTRY=hf://org/name: the published folder as one commit of a Hugging Face model repository, through
huggingface_hub's public API (create_repo, upload_folder). The endpoint and token are huggingface_hub's
own settings (HF_ENDPOINT, HF_TOKEN or the stored login), so nothing of them is written into a file.

The folder is checked against its manifest.json first (registry.folder_files), as for an S3 store; the
commit message names the version (the first 16 hex digits of the hash of every file, manifest.json
included), and the repository is created private where it does not exist. huggingface_hub's own HTTP
client has no timeout: for the upload its requests are bounded by s3_reads.STORE_PACE, as an S3 store's (a
request may take as long as the largest file at the pace's rate), and a Hub that does not answer is one
line. Tested against a local server replaying the Hub API's responses (tests/test_hub.py), not against
the live Hub, which the tests cannot
reach (they run offline)."""

from __future__ import annotations

import contextlib
import importlib
import time
import urllib.parse
from pathlib import Path

from pipeline.publish.puller import s3_reads
from pipeline.schema import ConfigError
from pipeline.setting_values import registry_problem


def parse_hub(url: str) -> str:
    """hf://org/name -> "org/name"; anything else is one line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "hf" or registry_problem(url):  # the form make checks too
        raise ConfigError(f"REGISTRY={url}: expected hf://org/name (a Hub model repository)")
    return f"{parts.netloc}{parts.path}".strip("/")


@contextlib.contextmanager
def hub_errors(where: str, nbytes: int = 0):
    """The Hub's failures as one line: a refused token as ConfigError, the rest as RegistryError; each
    request bounded by the `nbytes` it may carry at most, one that ran out of time named with how long."""
    from huggingface_hub import get_session
    from huggingface_hub.errors import HfHubHTTPError

    from pipeline.publish.registry import RegistryError

    pace, session = s3_reads.STORE_PACE, get_session()
    # the HTTP client huggingface_hub runs on: httpx up to 1.x (the quant environment), httpx2 from 2.0
    http = importlib.import_module(type(session).__module__.split(".")[0])
    # read: the Hub answers a request once it holds its bytes; write: a stalled receiver
    before = session.timeout
    session.timeout = http.Timeout(pace.request_s(nbytes), connect=pace.connect_s, write=pace.start_s)
    t0 = time.monotonic()
    try:
        yield
    except http.TransportError as e:  # timeouts, refused or dropped connections (after huggingface_hub's retries)
        raise RegistryError(
            f"{where}: no answer from the Hub to {e.request.method} {e.request.url} in {time.monotonic() - t0:.0f} s, "
            f"each request bounded at {pace.each(nbytes)}: {type(e).__name__}; check HF_ENDPOINT, the network and "
            "the Hub's status"
        ) from None
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if status in (401, 403):
            raise ConfigError(
                f"{where}: {status} (the Hub refused this token); set HF_TOKEN to a token with write access "
                "(or `hf auth login`)"
            ) from None
        raise RegistryError(f"{where}: {first}") from None
    finally:
        session.timeout = before


def upload_hub(folder: Path, url: str) -> tuple[str, str, str]:
    """Upload the published folder as one commit of hf://org/name; returns (name, version, where)."""
    from huggingface_hub import HfApi

    from pipeline.publish.registry import folder_files, version_of_files

    repo_id = parse_hub(url)
    manifest, files = folder_files(folder)
    name, version = manifest.get("name") or folder.name, version_of_files(files)
    where = f"hf://{repo_id}"
    api = HfApi()
    with hub_errors(where, max(f["size"] for f in files.values())):
        api.create_repo(repo_id, repo_type="model", private=True, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            commit_message=f"{name} version {version}",
            commit_description=f"manifest.json sha256 {manifest['sha256']}; {len(files)} files",
        )
    print(f"uploaded {where} ({len(files)} files): commit {info.oid} ({info.commit_url})", flush=True)
    return name, version, where
