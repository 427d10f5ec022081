"""Outputs that a reader never sees half of: a folder is built in a temporary folder beside its
destination and renamed into place only when complete (staging_dir), a file written beside itself and
renamed over it (write_text, write_json); what a killed run left is cleared up by the next (remove_stale)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from pipeline import exits
from pipeline.checkpoint_files import size_on_disk


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
