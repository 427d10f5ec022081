"""Who may reach the page: the login for any address off this machine, and one-line errors before anything starts."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from pipeline.schema import ConfigError


def page_login(host: str, environ=os.environ) -> tuple[str, str] | None:
    """The (user, password) the page asks for, from REVIEW_USER and REVIEW_PASSWORD, or None for no
    login. A host that is not this machine's loopback only with both: a one-line error otherwise."""
    user, password = (environ.get("REVIEW_USER") or "").strip(), environ.get("REVIEW_PASSWORD") or ""
    if bool(user) != bool(password):
        missing = "REVIEW_PASSWORD" if user else "REVIEW_USER"
        raise ConfigError(f"{missing}: unset or empty while the other is set; set both (the page's login) or neither")
    if not host:
        raise ConfigError("REVIEW_HOST: empty; leave it unset for 127.0.0.1 (this machine only)")
    if not (user or is_loopback(host)):
        raise ConfigError(
            f"REVIEW_HOST={host}: reachable from other machines, and the page and its API would answer anyone; "
            "set REVIEW_USER and REVIEW_PASSWORD in the environment (the page's login), or leave REVIEW_HOST unset"
        )
    return (user, password) if user else None


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is this machine's loopback (0.0.0.0 and :: are every
    interface, so not)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"REVIEW_HOST={host}: not an address or a name this machine resolves ({e})") from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_listenable(host: str) -> None:
    """A one-line error, before anything starts, where nothing can listen on `host` (not an address of
    this machine: a typo, another machine's LAN address)."""
    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(address)
    except OSError as e:
        raise ConfigError(
            f"REVIEW_HOST={host}: cannot listen there ({e.strerror}); use an address of this machine "
            "(0.0.0.0: all of them)"
        ) from None


def check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such folder; point MODEL (or the argument) at a model made by `make all`")
    if not any(model_dir.glob("*/manifest.json")):
        raise ConfigError(f"{model_dir}: no variants (*/manifest.json); run `make quantize` first")
