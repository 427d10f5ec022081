"""A folder's files as manifests list them: their sha256 against a manifest's, what is not a regular file,
which are weights, whether the weights are whole, their size."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import struct
from pathlib import Path


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


# Files a checkpoint cannot be without: a manifest that leaves one out describes another checkpoint.
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
CHECKPOINT_FILES = ("config.json", *WEIGHT_GLOBS)


def is_weights(rel: str) -> bool:
    """A checkpoint's weight file (GBs, hashed where figures or a publication depend on them) rather than
    one of its few-MB files (config, tokenizer, chat template), which every manifest read hashes."""
    return any(fnmatch.fnmatch(Path(rel).name, g) for g in WEIGHT_GLOBS)
