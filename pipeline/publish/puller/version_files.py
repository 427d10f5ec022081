"""What a published version is, file by file (pipeline/publish/puller/): its name, the hash of every file of
the folder, and every problem between a folder and the version's marker, SHA256SUMS and manifest.json.
Python's standard library only; pipeline/publish/registry.py names versions with the same functions."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

CHUNK = 1 << 20
VERSION_CHARS = 16


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def version_of(hashes: dict) -> str:
    """A published version's name: the first VERSION_CHARS digits of the hash of every file of the folder
    (path -> sha256), manifest.json included, so that a pinned version is every byte of it: what the
    manifest says (recipe, figures, the choice) as much as the weights. manifest.json's own sha256 is the
    hash of the other files (it cannot hold its own)."""
    return tree_hash(hashes)[:VERSION_CHARS]


def folder_version(folder: Path) -> str:
    """The version a published folder is (version_of over its regular files)."""
    return version_of({rel: sha256_file(folder / rel) for rel in regular_files(folder)[0]})


def tree_hash(hashes: dict) -> str:
    """The hash of a file list with their sha256s, as pipeline/identity.py makes manifest.json's sha256."""
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def regular_files(folder: Path) -> tuple[list[str], list[str]]:
    """(the regular files under `folder` by relative path, a problem for every other entry there: a symlink,
    whatever it points at, a FIFO, a device), links not followed."""
    files, problems = [], []
    for top, dirs, names in os.walk(folder):  # a link to a folder is listed in dirs and not entered
        for name in dirs + names:
            path = Path(top) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                files.append(str(path.relative_to(folder)))
            elif not stat.S_ISDIR(mode):
                what = "a symlink" if stat.S_ISLNK(mode) else "not a file or folder"
                problems.append(f"{path.relative_to(folder)}: {what}, not a regular file")
    return sorted(files), problems


def check_folder(folder: Path, version: str, marker: dict) -> list[str]:
    """Every problem between a folder and the version (empty: it is the version), its files hashed here."""
    present, problems = regular_files(folder)
    if problems:
        return problems
    return content_problems({rel: sha256_file(folder / rel) for rel in present}, folder, version, marker)


def content_problems(found: dict, folder: Path, version: str, marker: dict) -> list[str]:
    """Every problem between the files found in `folder` (path -> sha256) and the version: the marker's
    list, the version's name recomputed from them, then SHA256SUMS and manifest.json (empty: all good)."""
    files = marker.get("files") or {}
    problems = [f"{rel}: not part of version {version}" for rel in sorted(set(found) - set(files))]
    for rel, want in sorted(files.items()):
        if rel not in found:
            problems.append(f"{rel}: missing")
        elif found[rel] != want.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the version's")
    if problems:
        return problems
    for needed in ("manifest.json", "SHA256SUMS"):
        if needed not in found:
            return [f"{needed}: not part of version {version}"]
    # the marker agrees, but it is the store's word: the version's name is what was pinned
    if (got := version_of(found)) != version:
        return [
            f"version {version} is not these files: they hash to {got} (rewritten in the "
            "store with their marker since it was published; nothing was put in place)"
        ]
    content = {rel: h for rel, h in found.items() if rel != "manifest.json"}
    tree = tree_hash(content)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        sums = dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())
    except ValueError as e:  # UnicodeDecodeError and json's errors are ValueErrors
        return [f"manifest.json or SHA256SUMS: unreadable ({e})"]
    if not isinstance(manifest, dict):
        return ["manifest.json: not a JSON object"]
    if manifest.get("sha256") != tree:
        problems.append(f"manifest.json: sha256 {manifest.get('sha256')} is not the hash of the files ({tree})")
    for rel, digest in sorted(sums.items()):
        if found.get(rel) != digest:
            problems.append(f"SHA256SUMS: {rel} does not match the file")
    listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    for rel in sorted(set(listed) | set(content)):
        if listed.get(rel) != content.get(rel):
            problems.append(f"manifest.json: {rel} does not match the file")
    unlisted = set(found) - set(sums) - {"SHA256SUMS", "manifest.json"}
    problems += [f"SHA256SUMS: does not list {rel}" for rel in sorted(unlisted)]
    return problems
