"""What every input file shares: ConfigError, strict models, YAML loading with its limits, the check
that names the file and the key, excerpts for error messages, and Source, where rows come from."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Hashable
from pathlib import Path

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator

from pipeline.setting_values import repeated  # one home: make runs it before pydantic is installed


class ConfigError(Exception):
    """Bad input: the message is one line naming the file or setting and what to do."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _each_once(members: list) -> list:
    if twice := repeated(members):
        raise ValueError(f"{excerpt(twice[0])} is given twice; give each once")
    return members


# A list field whose members each count once (seeds, concurrency levels, ...): a repeat would be run,
# measured or counted twice. `Annotated[list[int], EACH_ONCE]`.
EACH_ONCE = AfterValidator(_each_once)


# Values an alias (*name) repeats count once for every place it appears: ten nested aliases of ten make
# ten billion values ("billion laughs"), a few lines that no error message or reader can print or walk.
# A file may expand to its own length plus this many characters of values and structure.
MAX_ALIAS_EXPANSION = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: plain YAML
    keeps the last value silently, so `group_size: 64` then `group_size: 32` would build a 32. A value
    PyYAML's constructors refuse (an integer of 5,000 digits, 2025-02-30) is a YAML error at its line."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError) as e:
            raise yaml.constructor.ConstructorError(None, None, excerpt_text(str(e)), node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} as a key; keys are names", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {excerpt(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def expanded_size(root: yaml.Node) -> int | None:
    """How big a YAML document is with its aliases written out: one per node plus the characters of
    each scalar, every alias counted in full where it appears; None where an alias contains itself.
    Each node is walked once (a shared node's size is remembered), so a bomb is measured, not expanded."""
    sizes: dict[int, int] = {}
    ancestors: set[int] = set()  # nodes whose children are being walked: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1 + len(node.value)
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            ancestors.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        elif id(node) in ancestors:
            return None
        elif id(node) not in sizes:
            ancestors.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def load_yaml_file(path: Path) -> object:
    """A YAML file's data; any problem is one line naming the file (and the line, where YAML knows it).
    Every YAML input (recipes, calibration sets, suites, policies, bench profiles, a published
    serve.yaml) is read here."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give a .yaml file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        text = path.read_text()
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            size = expanded_size(node)
            if size is None:
                raise ConfigError(f"{path}: an alias (*name) contains itself; write the value out")
            if size > len(text) + MAX_ALIAS_EXPANSION:
                raise ConfigError(
                    f"{path}: its aliases (*name) expand to {size:,} characters, more than the file's "
                    f"{len(text):,} + {MAX_ALIAS_EXPANSION:,}; write the values out or alias fewer"
                )
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        # where the broken construct began (an unclosed '[' is found only at the end of the file), else
        # where the problem was seen
        mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}not valid YAML ({what})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; not a configuration file?") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None


def _load_yaml(path: Path) -> dict:
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return data


def _validate(model: type[BaseModel], path: Path):
    return check_data(model, _load_yaml(path), path)


def check_data(model: type[BaseModel], data, path: Path):
    """`data` as `model`, or a one-line ConfigError naming the file, the key and what is wrong; the value
    is quoted as a bounded excerpt (a key or value may be megabytes)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        # a union's tag (the schema's are in parentheses: eval_outputs.AnySuiteRun) is not a key of the file
        key = ".".join(excerpt_text(str(p), 60) for p in err["loc"] if not re.fullmatch(r"\(\w+\)", str(p)))
        msg = excerpt_text(err["msg"].removeprefix("Value error, "), 400)
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; allowed: {', '.join(model.model_fields)}"
        elif key and "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {excerpt(err['input'])})"
        raise ConfigError(f"{path}: {key + ': ' if key else ''}{msg}") from None


_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel = 3
_EXCERPT.maxtuple = _EXCERPT.maxlist = _EXCERPT.maxarray = _EXCERPT.maxdict = 4
_EXCERPT.maxset = _EXCERPT.maxfrozenset = 4
_EXCERPT.maxstring = _EXCERPT.maxother = _EXCERPT.maxlong = 80


def excerpt(value, limit: int = 100) -> str:
    """repr(value) in at most about `limit` characters, with its length where it was cut; walks only what
    it shows, so a huge or deeply nested value (YAML aliases can make one) costs nothing."""
    text = excerpt_text(_EXCERPT.repr(value), limit)
    if isinstance(value, (str, bytes)) and len(value) > _EXCERPT.maxstring:
        text += f" ({len(value):,} {'characters' if isinstance(value, str) else 'bytes'})"
    elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 4:
        text += f" ({len(value):,} items)"
    return text


def excerpt_text(text: str, limit: int = 100) -> str:
    """`text` cut to `limit` characters, marked with '...' where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Source(Strict):
    """Where rows come from, for calibration sets and suites alike (pipeline/data.py reads them).
    Exactly one source family: a dataset (hub id online, or a file under DATA_DIR offline) or rows the
    project generates itself (so the embedded default needs no data at all)."""

    description: str
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    local_file: str | None = None  # relative to the DATA_DIR setting
    generator: str | None = None  # each kind narrows it to the generators it has
    seed: int = 0  # generators

    @model_validator(mode="after")
    def _one_source(self):
        from_dataset = self.hub_id is not None or self.local_file is not None
        if from_dataset == (self.generator is not None):
            raise ValueError("source: give either generator, or hub_id and/or local_file")
        return self
