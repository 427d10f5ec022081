"""What a setting's value must be, beyond the characters its kind allows (pipeline/settings.py): each check
says, in words, what is expected, and a problem is one line naming the setting, the value and that.

Checked where a value enters: by make (pipeline/settings.py, before any command is built: values_problem
over the whole table) and by a stage that reads one from its environment (settings.environment_value).
Standard library only, as settings.py.
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
NAME = re.compile(r"[A-Za-z0-9._-]+")  # names become file names inside commands
NUMBER = re.compile(r"[0-9]+")
YES = ("1", "true", "yes", "TRUE", "YES", "True", "Yes")
NO = ("", "0", "false", "no", "FALSE", "NO", "False", "No")
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


def repeated(members) -> list:
    """The members given more than once, each once, in the order of their second appearance. Here, not in
    pipeline.schema (which imports it): make runs this module, through settings.py, before pydantic is
    installed."""
    seen, twice = set(), []
    for member in members:
        if member in seen and member not in twice:
            twice.append(member)
        seen.add(member)
    return twice


def values_problem(values: dict[str, str], settings, root: Path) -> str | None:
    """The first of make's settings (`values`, by name, of the table `settings`: settings.SETTINGS) whose
    value is not what it must be, as one line naming the setting and what to do; None where every one is."""
    for name, value in values.items():
        if any(ord(c) < 32 for c in value) or value.endswith("\\"):
            return f"{name}: one line of text, without control characters or a final backslash"
    for s in settings:
        pattern = {"names": NAME, "numbers": NUMBER}.get(s.kind)
        bad = [w for w in values[s.name].split() if pattern and not pattern.fullmatch(w)]
        if bad:
            allowed = "letters, digits, '.', '_' and '-'" if s.kind == "names" else "digits"
            return f"{s.name}={bad[0]}: only {allowed} are allowed"
    for s in settings:
        words = values[s.name].split()
        # numbers by value: SEEDS="1 01" is seed 1 twice
        if s.each_once and (twice := repeated([int(w) for w in words] if s.kind == "numbers" else words)):
            return f"{s.name}={values[s.name]}: {twice[0]} is given twice; give each once"
    for s in settings:
        # a path is taken as it is written, spaces included: one at either end is a stray one, and would name
        # another folder than the one meant (OUT/'<model> ', which make clean removes)
        if s.kind == "path" and values[s.name] != values[s.name].strip():
            return f"{s.name}='{values[s.name]}': begins or ends with a space; remove it"
    if problem := model_folder_problem(values["MODEL"]):
        return problem
    if os.path.lexists(values["OUT"]) and not os.path.isdir(values["OUT"]):
        return f"OUT={values['OUT']}: not a folder; set OUT to a folder (made if missing)"
    if values["CHAT"] and len(values["CHAT"].split()) != 2:
        return f'CHAT={values["CHAT"]}: name two variants, e.g. CHAT="bf16 gptq-w4a16"'
    if len(values["ENDPOINT_NAME"].split()) > 1 or values["ENDPOINT_NAME"].startswith("."):
        return f"ENDPOINT_NAME={values['ENDPOINT_NAME']}: one name, not starting with '.'"
    for name in ("ENDPOINT_MODEL", "ENDPOINT_NAME"):
        if values[name] and not values["ENDPOINT"]:
            return f"{name}: set without ENDPOINT; give ENDPOINT=http://host:port/v1 too"
    for s in settings:
        if s.kind == "yes-no" and values[s.name].strip() not in YES + NO:
            return f"{s.name}={values[s.name]}: use 1 (yes) or 0 (no)"
    for s in settings:
        if problem := setting_problem(s, values[s.name], root):
            return problem
    for s in settings:
        # a list of names set empty where its default names some: the stage would get no list at all
        default = s.default(values) if callable(s.default) else s.default
        if s.files and not s.one and not values[s.name].split() and default.split():
            return f"{s.name}={values[s.name]}: expected at least one name of {s.files}/*.yaml; unset, it is {default}"
    return None


def setting_problem(s, value: str, root: Path) -> str | None:
    """What `value` of setting `s` (a settings.Setting) is not, beyond its characters: the files its
    names name, what `expect` says."""
    if s.files and (value.strip() or s.one):
        return named_files_problem(s.name, value, s.files, root, s.one)
    has_default = isinstance(s.default, str) and s.default  # set empty, it would reach a command as nothing
    if not s.expect or (s.kind == "interpreter" and value == s.default) or not (value or has_default):
        return None  # unset; an interpreter of make setup's, which make creates
    return value_problem(s.name, value, s.expect)


# OUT's own folders, beside the models' (OUT/<model>/): a model of one of these names would be theirs
OUT_FOLDERS = ("sources", "published", "pulled")


def model_folder_problem(model: str) -> str | None:
    """Why MODEL's last part, the folder OUT/<it> that every stage writes (and make clean removes), is not a
    model's own folder; None where it is. As the shell's basename reads it: MODEL=/ (DIR/ with DIR unset)
    is '/', which made OUT/<it> OUT itself."""
    stripped = model.rstrip("/")
    name = stripped.rsplit("/", 1)[-1] if stripped else ("/" if model else "")
    if name in ("", "/", ".", "..") or name.startswith("."):
        return f"MODEL={model}: its last part ({name or 'empty'}) is not a model's name; give a model folder or hub id"
    if name in OUT_FOLDERS:
        return (
            f"MODEL={model}: a model named {name!r} would share OUT/{name}/ with the pipeline's own {name}; "
            "rename its folder"
        )
    return None
