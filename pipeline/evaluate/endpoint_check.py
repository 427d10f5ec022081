"""A running OpenAI-compatible vLLM server to evaluate (make eval ENDPOINT=...): checked before any long
work, each failure one line naming the setting, and what it reports recorded as schema.EndpointInfo.

    info = connect("http://127.0.0.1:8000/v1", api_key_from_environment(), None, need=2048)

make eval's alone (evaluate.on_endpoint runs the suites on it). The standard library's HTTP client: these are three
GET requests before the run, where a connection pool buys nothing.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from pipeline.schema import ConfigError, EndpointInfo

# Where the key is read from, in this order: never the command line, which every local user can read.
# VLLM_API_KEY is what the published k8s.yaml and docker-compose.yml give their server.
KEY_VARIABLES = ("ENDPOINT_API_KEY", "VLLM_API_KEY")
TIMEOUT_S = 10
NOT_A_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def api_key_from_environment() -> tuple[str | None, str]:
    """(the key, the variable it came from), or (None, the first variable to set)."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return os.environ[name], name
    return None, KEY_VARIABLES[0]


def base_url(url: str) -> str:
    """ENDPOINT as the OpenAI base URL, http(s)://host[:port][/prefix]/v1 without a final '/'; one line
    where it is not one."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"ENDPOINT={url}: not an http(s) URL; give the server's base URL, e.g. http://127.0.0.1:8000/v1"
        )
    if parts.username or parts.password:
        raise ConfigError(f"ENDPOINT: a URL with credentials in it; export the key as {KEY_VARIABLES[0]} instead")
    if parts.query or parts.fragment or not parts.path.rstrip("/").endswith("/v1"):
        raise ConfigError(f"ENDPOINT={url}: the OpenAI base URL ends in /v1, e.g. http://127.0.0.1:8000/v1")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def default_name(model_id: str) -> str:
    """The label of an endpoint's results (endpoint-<name>/) from its served model id: the id's last
    path component in letters, digits, '.', '_' and '-' (a leading '.' would hide the folder)."""
    name = NOT_A_NAME.sub("-", model_id.rstrip("/").rsplit("/", 1)[-1]).lstrip(".-")
    return name or "served"


def _get(url: str, api_key: str | None, what: str, key_from: str) -> dict:
    """GET a JSON document; every way it can fail as one line naming ENDPOINT and what to do."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as reply:
            body = reply.read()
    except urllib.error.HTTPError as e:
        if e.code == 401 and api_key:
            raise ConfigError(
                f"ENDPOINT={what}: the server refuses the key in {key_from} (401); export the server's key as "
                f"{KEY_VARIABLES[0]}"
            ) from None
        if e.code == 401:
            raise ConfigError(
                f"ENDPOINT={what}: the server wants an API key (401); export it as {KEY_VARIABLES[0]} "
                f"(or {KEY_VARIABLES[1]})"
            ) from None
        raise ConfigError(f"ENDPOINT={what}: GET {url} answered {e.code} {e.reason}; is this a vLLM server?") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        why = "connection refused" if isinstance(reason, ConnectionRefusedError) else str(reason)
        if isinstance(reason, TimeoutError):
            why = f"no answer in {TIMEOUT_S} s"
        raise ConfigError(f"ENDPOINT={what}: no server answers ({why}); start it or fix the URL") from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ConfigError(f"ENDPOINT={what}: GET {url} did not answer a JSON object; is this a vLLM server?")
    return doc


def _version(root: str, api_key: str | None) -> str | None:
    """vLLM's GET /version (at the server's root, outside /v1); None where nothing answers it there
    (a proxy that forwards /v1 only)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(root + "/version", headers=headers), timeout=TIMEOUT_S) as r:
            version = json.loads(r.read()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def pick_model(cards: list[dict], model: str | None, url: str) -> dict:
    """The served model to evaluate: ENDPOINT_MODEL, or the only one the server serves."""
    ids = [c["id"] for c in cards]
    if model is None and len(cards) == 1:
        return cards[0]
    if model is None:
        raise ConfigError(
            f"ENDPOINT_MODEL: unset, and {url} serves {len(ids)} models ({', '.join(ids)}); set it to one"
        )
    for card in cards:
        if card["id"] == model:
            return card
    raise ConfigError(f"ENDPOINT_MODEL={model}: {url} does not serve it; it serves {', '.join(ids) or 'nothing'}")


def connect(url: str, api_key: str | None, model: str | None, need: int = 0, key_from: str = "") -> EndpointInfo:
    """Check the server at `url` (.../v1) and say what it serves: it answers, takes `api_key`, serves
    `model` (None: the only one it serves), and takes requests of `need` tokens (prompt + generation,
    the suites' longest). `key_from`: the variable the key came from, for the message that refuses it."""
    base = base_url(url)
    doc = _get(base + "/models", api_key, base, key_from or KEY_VARIABLES[0])
    cards = doc.get("data")
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise ConfigError(f"ENDPOINT={base}: GET {base}/models did not answer a model list; is this a vLLM server?")
    card = pick_model(cards, model or None, base)
    max_len = card.get("max_model_len")
    if not isinstance(max_len, int) or max_len < 1:
        raise ConfigError(f"ENDPOINT={base}: {card['id']} has no max_model_len in /v1/models; is this a vLLM server?")
    if need > max_len:
        raise ConfigError(
            f"ENDPOINT={base}: {card['id']} is served with max_model_len {max_len}, the suites need {need} tokens "
            "(longest prompt + max_tokens); lower MAX_TOKENS or serve it with a larger --max-model-len"
        )
    return EndpointInfo(
        url=base,
        model=card["id"],
        root=card.get("root") if isinstance(card.get("root"), str) else None,
        max_model_len=max_len,
        served=[c["id"] for c in cards],
        vllm_version=_version(base.removesuffix("/v1"), api_key),
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
