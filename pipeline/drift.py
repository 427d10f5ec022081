"""Whether the input files a figure was made from still say what they said then: a recipe edited after
its variant was built, a suite, bench profile or policy edited after the figures were made from it.

Every output records what it was made from: manifest.json the recipe and calibration set quantize read
(their settings), eval/results.json each suite (the hash of its settings, settings_sha256), bench.json
the profile (its settings), report.json the policy (its settings). `check_unchanged` compares each with
the file now at that path and refuses the first that differs in one line naming the file, the setting and
the command that makes the output again; the stages call it before any long work. A module below the
stages: it imports none of them.

What is compared is the settings as the schema reads them, not the file's bytes: a comment or a new line
changes no figure, and `make quantize` decides to rebuild on the settings too (its build key). Left out
of every comparison: `description` (what the file is for; no figure depends on it) and the keys only one
side has (a key the schema gained since the output was written took its default then, as the record
shows by lacking it). A file that is no longer there is not compared: nothing on disk then claims other
settings than the record's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.schema import (
    Bench,
    ConfigError,
    EvalRun,
    LmEvalSuite,
    Report,
    Suite,
    VariantManifest,
    excerpt,
    is_lm_eval_suite,
    load_calib,
    load_lm_eval_suite,
    load_policy,
    load_profile,
    load_recipe,
    load_suite,
)
from pipeline.settings import ROOT

# What no figure depends on: `file` is where the settings were read from (the record's own path), and
# `description` says what the file is for.
NOT_SETTINGS = frozenset({"file", "description"})


@dataclass(frozen=True)
class Recorded:
    """One input file as an output recorded it when its figures were made: the settings (which name the
    key that differs), or only their hash (settings_sha256) where the output records no more."""

    file: str  # as recorded: relative paths are the repository's, where make runs the stages
    read: Callable[[Path], dict]  # the settings of the file now, as the stage reads them
    output: Path  # the file that recorded it
    remedy: str  # the command that makes `output` again from the file as it is now
    settings: dict | None = None
    sha256: str | None = None
    ignore: frozenset[str] = frozenset()  # keys a command line overrides (bench's TP): not the file's

    @property
    def path(self) -> Path:
        path = Path(self.file)
        return path if path.is_absolute() else ROOT / path


def settings_sha256(settings: dict) -> str:
    """The hash an output records of an input's settings (eval/results.json, a suite's)."""
    kept = {k: v for k, v in settings.items() if k not in NOT_SETTINGS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def differences(recorded: dict, now: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, recorded value, value now) for every key both have whose values differ; nested mappings key
    by key (capacity.tolerance), so the line names the setting, not the section."""
    out = []
    for key in recorded.keys() & now.keys():
        was, is_ = recorded[key], now[key]
        if isinstance(was, dict) and isinstance(is_, dict):
            out += differences(was, is_, f"{prefix}{key}.")
        elif was != is_:
            out.append((f"{prefix}{key}", was, is_))
    return sorted(out, key=lambda d: d[0])


def drift(item: Recorded) -> str | None:
    """None where the file says what `item` recorded (or is gone); else the one line that refuses it."""
    if not item.path.is_file():
        return None
    now = _as_json(item.read(item.path))  # a file that no longer reads is its own one-line ConfigError
    if item.settings is not None:
        recorded = {k: v for k, v in _as_json(item.settings).items() if k not in NOT_SETTINGS | item.ignore}
        now = {k: v for k, v in now.items() if k not in NOT_SETTINGS | item.ignore}
        changed = differences(recorded, now)
        if not changed:
            return None
        key, was, is_ = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return (
            f"{item.file}: {key} is {excerpt(is_, 60)}, but {item.output} was made with {excerpt(was, 60)}{more}; "
            f"{item.remedy}"
        )
    if item.sha256 is None or settings_sha256(now) == item.sha256:
        return None
    return f"{item.file}: changed since {item.output} was made from it; {item.remedy}"


def check_unchanged(items: Iterable[Recorded]) -> None:
    """A one-line ConfigError for the first input that no longer says what its output recorded."""
    for item in items:
        if line := drift(item):
            raise ConfigError(line)


def _as_json(settings: dict) -> dict:
    # tuples and lists, models and their dumps, compared as the JSON files hold them
    return json.loads(json.dumps(settings, default=str))


# ---------------------------------------------------------------- how each kind of input is read now
def recipe_settings(path: Path) -> dict:
    return load_recipe(path).used()  # what quantize's build key reads of it


def calib_settings(path: Path) -> dict:
    return load_calib(path).model_dump(mode="json")


def suite_settings(path: Path) -> dict:
    return settings_of_suite(load_lm_eval_suite(path) if is_lm_eval_suite(path) else load_suite(path))


def settings_of_suite(suite: Suite | LmEvalSuite) -> dict:
    # the defaults left out: a key the schema gains later, at its default, leaves the hash as it was
    return suite.model_dump(mode="json", exclude_defaults=True)


def suite_sha256(suite: Suite | LmEvalSuite) -> str:
    """What eval/results.json records of a suite as eval read it (SuiteRun.settings_sha256)."""
    return settings_sha256(settings_of_suite(suite))


def profile_settings(path: Path) -> dict:
    return load_profile(path).model_dump(mode="json")


def policy_settings(path: Path) -> dict:
    return load_policy(path).model_dump(mode="json")


# ----------------------------------------------------------------- what each output was made from
def variant_inputs(variant_dir: Path, manifest: VariantManifest) -> list[Recorded]:
    """The recipe and calibration set `make quantize` built the variant from, as its manifest records them."""
    out = variant_dir / "manifest.json"
    calib = manifest.calibration
    calib_setting = f" CALIB={Path(calib.file).stem}" if calib else ""
    remedy = f"rebuild it with `make quantize-{variant_dir.name}{calib_setting} FORCE=1`, or put the file back"
    recipe = manifest.recipe.model_dump(mode="json")
    items = [Recorded(manifest.recipe.file, recipe_settings, out, remedy, settings=recipe)]
    if calib is not None:
        items.append(Recorded(calib.file, calib_settings, out, remedy, settings=calib.model_dump(mode="json")))
    return items


def eval_inputs(variant_dir: Path, run: EvalRun) -> list[Recorded]:
    """The suites eval/results.json was measured with (their settings' hash, where it records one)."""
    out = variant_dir / "eval/results.json"
    if run.endpoint is not None:  # a running server's results (endpoint-<name>/)
        name = variant_dir.name.removeprefix("endpoint-")
        remedy = f"run `make eval ENDPOINT={run.endpoint.url} ENDPOINT_NAME={name}` again"
    else:
        remedy = f"run `make eval RECIPES={variant_dir.name}` again"
    return [Recorded(s.file, suite_settings, out, remedy, sha256=s.settings_sha256) for s in run.suites.values()]


def bench_inputs(variant_dir: Path, bench: Bench) -> list[Recorded]:
    """The profile bench.json was measured with; its tensor_parallel_size is the command line's (TP=)."""
    file = bench.profile.file
    remedy = f"run `make bench BENCH_RECIPES={variant_dir.name} BENCH_PROFILE={Path(file).stem}` again"
    profile = bench.profile.model_dump(mode="json")
    ignore = frozenset({"tensor_parallel_size"})
    return [Recorded(file, profile_settings, variant_dir / "bench.json", remedy, profile, None, ignore)]


def figure_inputs(
    variant_dir: Path, manifest: VariantManifest, run: EvalRun | None, bench: Bench | None
) -> list[Recorded]:
    """Everything a variant's figures were made from: the build's recipe and calibration set, the suites of
    its eval/results.json, the profile of its bench.json (each where there is one)."""
    return [
        *variant_inputs(variant_dir, manifest),
        *(eval_inputs(variant_dir, run) if run else []),
        *(bench_inputs(variant_dir, bench) if bench else []),
    ]


def report_inputs(model_dir: Path, report: Report) -> list[Recorded]:
    """The policy report.json's decision was made under."""
    policy = report.policy.model_dump(mode="json")
    file = report.policy.file
    # a policy outside the repository is recorded by its name alone (policy.policy_file_label): POLICY, which
    # make exports to every stage, is that file where its name is the one recorded
    given = os.environ.get("POLICY")
    if given and not (ROOT / file).is_file() and Path(given).name == file:
        file = given
    remedy = f"run `make report POLICY={file}` again"
    return [Recorded(file, policy_settings, model_dir / "report.json", remedy, settings=policy)]
