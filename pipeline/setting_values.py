"""What a setting's value must be, beyond the characters its kind allows (pipeline/settings.py): each check
says, in words, what is expected, and a problem is one line naming the setting, the value and that.

Checked where a value enters: by make (pipeline/settings.py, before any command is built) and by a stage
that reads one from its environment (settings.environment_value). Standard library only, as settings.py.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.parse
from collections.abc import Callable
from pathlib import Path

# vLLM's --dtype choices (EVAL_DTYPE, SMOKE_DTYPE)
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")  # a Hub repository


def _whole(low: int, high: int | None = None) -> Callable[[str], bool]:
    return lambda v: v.isdigit() and int(v) >= low and (high is None or int(v) <= high)


# name -> (whether a value is one, what is expected in words)
EXPECTED: dict[str, tuple[Callable[[str], bool], str]] = {
    "count": (_whole(1), "one whole number of at least 1"),
    "seconds": (_whole(1), "one whole number of seconds, at least 1"),
    "port": (_whole(1, 65535), "a TCP port, one whole number from 1 to 65535"),
    "dtype": (lambda v: v in DTYPES, f"one of vLLM's dtypes: {', '.join(DTYPES)}"),
    "device": (lambda v: v in ("cpu", "cuda"), "cpu or cuda"),
    "version": (lambda v: len(v.split()) == 1, "a version (16 hex digits) or an alias, e.g. latest"),
    "file": (lambda v: Path(v).is_file(), "an existing file"),
    "folder": (lambda v: Path(v).is_dir(), "an existing folder"),
    "interpreter": (lambda v: shutil.which(v) is not None, "a python interpreter that exists and can be run"),
}


def value_problem(name: str, value: str, expected: str) -> str | None:
    """The one line of `value` of setting `name` that is not what `expected` (an EXPECTED key) says; None
    where it is."""
    if expected == "registry":
        return registry_problem(value)
    ok, words = EXPECTED[expected]
    return None if ok(value) else f"{name}={value}: expected {words}"


def named_files_problem(name: str, value: str, folder: str, root: Path, one: bool) -> str | None:
    """Names that each name folder/<name>.yaml under root (RECIPES: recipes/bf16.yaml), or, with `one`,
    exactly one such name: the first that names none, with the names there are."""
    there = " ".join(sorted(p.stem for p in (root / folder).glob("*.yaml")))
    if one and len(value.split()) != 1:
        return f"{name}={value}: expected one name of {folder}/*.yaml: {there}"
    for word in value.split():
        if not (root / folder / f"{word}.yaml").is_file():
            return f"{name}={value}: no {folder}/{word}.yaml; expected names of {folder}/*.yaml: {there}"
    return None


def registry_problem(url: str) -> str | None:
    """REGISTRY's form: s3://bucket/prefix or hf://org/name (pipeline/publish/registry.py, pipeline/publish/hub.py)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "oci":
        return f"REGISTRY={url}: oci:// is not supported (docs/published-files.md); use s3://bucket/prefix or hf://org/name"
    if parts.scheme == "hf":
        repo_id = f"{parts.netloc}{parts.path}".strip("/")
        if parts.query or parts.fragment or not REPO_ID.fullmatch(repo_id):
            return f"REGISTRY={url}: expected hf://org/name (a Hub model repository)"
        return None
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        return f"REGISTRY={url}: expected s3://bucket/prefix or hf://org/name"
    return None


def environment_problem(name: str, expected: str, environ=os.environ) -> str | None:
    value = environ.get(name)
    return None if not value else value_problem(name, value, expected)
