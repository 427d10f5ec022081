"""The typed readers of what the stages wrote under artifacts/: each file read back into its schema model
(a missing or unknown key is one line naming the file and the key), a variant's manifest held to its
files. Writing them whole is pipeline/staging.py's; hashing a folder's files, pipeline/checkpoint_files.py's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pipeline.checkpoint_files import CHECKPOINT_FILES, is_weights, manifest_differences, sha256_file
from pipeline.identity import tree_hash
from pipeline.schema import (
    Bench,
    BenchFailure,
    ConfigError,
    EvalReport,
    EvalRun,
    Report,
    Sample,
    VariantManifest,
    check_data,
)

RANDOM_WEIGHTS_BANNER = "random weights — not for accuracy"


def read_json(path: Path, stage: str) -> object:
    """The JSON a stage wrote at `path`, None where there is no such file. A file that is not whole JSON (a
    copy cut short, an edit, a full disk) or cannot be read is one ConfigError naming it and the stage
    that writes it, `stage` (e.g. "make eval"), to run again."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        what = f"not valid JSON at line {e.lineno} column {e.colno} ({e.msg.removesuffix(' at')}: cut short or edited?)"
    except UnicodeDecodeError as e:
        what = f"not UTF-8 text (byte {e.start:,}: {e.reason})"
    except RecursionError:
        what = "nested too deeply to read"
    except OSError as e:
        what = f"cannot be read ({e.strerror or e})"
    raise ConfigError(f"{path}: {what}; run `{stage}` again")


def read_manifest(folder: Path) -> dict | None:
    """A folder's manifest.json as it is, unchecked; None where there is none or it is unreadable (the
    callers rebuild, or say so). read_variant_manifest is the checked reader."""
    try:
        return read_json(folder / "manifest.json", "make quantize")
    except ConfigError:
        return None


def serving_settings(variant_dir: Path) -> dict:
    """The vLLM engine settings a variant's recipe fixes (today: the KV cache dtype), from its manifest,
    so that eval, bench, the review page and the published serve.yaml run it the same way. Empty for
    vLLM's defaults, and for a source model (no manifest, or pipeline.source's, of no recipe)."""
    if (read_manifest(variant_dir) or {}).get("kind") == "source":
        return {}
    manifest = read_variant_manifest(variant_dir)
    kv = "auto" if manifest is None else manifest.recipe.kv_cache_dtype
    return {"kv_cache_dtype": kv} if kv != "auto" else {}


def read_variant_manifest(folder: Path, verify: Literal["sizes", "hashes"] = "sizes") -> VariantManifest | None:
    """A variant's manifest.json, checked against schema.VariantManifest and against the files it
    describes; None where there is none. Every check is a one-line ConfigError naming the file and
    saying to rebuild: a manifest is believed only as far as the files bear it out.

    sizes (milliseconds, every reader): its sha256 is the hash of its file list, every file it lists is
    inside the folder (no absolute path, no '..') and there as a file of its own (not a symlink, whose
    target can change under the manifest), the checkpoint's weights and config are listed, the sha256 of
    every listed file but the weights (config, tokenizer, chat template: an edit there changes what is
    served as surely as a weight does) is what it records, and size_bytes is what the listed files add up
    to on disk. hashes (seconds for GBs: where a decision or a publication depends on the files, and
    before eval and bench spend minutes on them): the sha256 of every listed file, the weights too."""
    path = folder / "manifest.json"
    data = read_json(path, "make quantize")
    if data is None:
        return None
    manifest = check_data(VariantManifest, data, path)
    rebuild = f"rebuild it with `make quantize RECIPES={folder.name} FORCE=1`"
    files = manifest.files
    if manifest.sha256 != tree_hash(files):
        raise ConfigError(f"{path}: sha256 is not the hash of the files it lists (edited?); {rebuild}")
    # a listed path outside the folder is another folder's file (publish would copy it, and write it, there)
    outside = [rel for rel in files if Path(rel).is_absolute() or ".." in Path(rel).parts]
    if outside:
        raise ConfigError(f"{path}: lists {', '.join(map(repr, outside))}, outside {folder} (edited?); {rebuild}")
    unlisted = sorted(str(p.relative_to(folder)) for g in CHECKPOINT_FILES for p in folder.glob(g) if p.is_file())
    problems = [f"{rel}: missing" for rel in files if not (folder / rel).is_file()]
    problems += [f"{rel}: a symlink to {os.readlink(folder / rel)}" for rel in files if (folder / rel).is_symlink()]
    problems += [f"{rel}: not in manifest.json" for rel in unlisted if rel not in files]
    if not problems:
        hashed = {rel: sha for rel, sha in files.items() if verify == "hashes" or not is_weights(rel)}
        problems = manifest_differences(hashed, {rel: sha256_file(folder / rel) for rel in hashed}, extra=False)
    if problems:
        raise ConfigError(f"{folder}: changed since it was built ({'; '.join(problems)}); {rebuild}")
    size = sum((folder / rel).stat().st_size for rel in files)
    if manifest.size_bytes != size:
        raise ConfigError(
            f"{path}: size_bytes is {manifest.size_bytes:,}, its files add up to {size:,} on disk (edited?); {rebuild}"
        )
    return manifest


def read_eval_run(variant_dir: Path) -> EvalRun | None:
    """The "pipeline" entry of a variant's eval/results.json, checked against schema.EvalRun; None where
    the variant was not evaluated."""
    path = variant_dir / "eval/results.json"
    if not path.is_file():
        return None
    results = read_json(path, "make eval")
    # the rest of the file is lm-eval's shape, open to whatever lm-eval writes
    run = results.get("pipeline") if isinstance(results, dict) else None
    return check_data(EvalRun, run, path)


def read_samples(path: Path) -> list[Sample]:
    """A suite's samples_<suite>.jsonl (make eval), every line checked against schema.Sample (a one-line
    ConfigError naming the file and line where one is off)."""
    records = []
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e}); run `make eval` again") from None
    for number, line in enumerate(text.splitlines(), 1):
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{path}:{number}: not JSON ({e}); run `make eval` again") from None
        records.append(check_data(Sample, data, Path(f"{path}:{number}")))
    return records


def read_fidelity(path: Path) -> dict:
    """A fidelity suite's fidelity_<suite>.npz (make eval) as its arrays; a one-line error naming it where
    it is missing or not whole."""
    import zipfile

    import numpy as np

    try:
        with np.load(path) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; run `make eval` again") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{path}: not a whole .npz file ({e}); run `make eval` again") from None


def read_report(model_dir: Path) -> Report:
    """artifacts/<model>/report.json (make report), checked against schema.Report; a one-line error
    where there is none."""
    path = model_dir / "report.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no report; run `make report` first")
    return check_data(Report, read_json(path, "make report"), path)


def read_eval_report(model_dir: Path) -> EvalReport | None:
    """artifacts/<model>/eval-report.json (make eval), checked against schema.EvalReport; None where there
    is none."""
    path = model_dir / "eval-report.json"
    report = read_json(path, "make eval")
    return None if report is None else check_data(EvalReport, report, path)


def read_bench(variant_dir: Path) -> tuple[Bench | None, str | None]:
    """(bench.json, None), or (None, its error) when that variant's bench failed (its figures are not
    there), or (None, None) when it was not benched. Checked against schema.Bench / BenchFailure."""
    path = variant_dir / "bench.json"
    bench = read_json(path, "make bench")
    if bench is None:
        return None, None
    if isinstance(bench, dict) and "error" in bench:
        return None, check_data(BenchFailure, bench, path).error
    return check_data(Bench, bench, path), None
