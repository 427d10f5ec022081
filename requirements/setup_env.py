"""Make one of the project's environments (.venv-quant, .venv-serve) from its lock file; `make setup` runs it.

    python3 requirements/setup_env.py check VENV LOCK [--also PKG ...]   prints "up-to-date" or "stale"
    python3 requirements/setup_env.py make VENV LOCK --device cpu|cuda [--also PKG ...]

Whether a venv is up to date is decided by content, never by timestamps (every clone and checkout
makes the lock files newer than anything already there): VENV/.installed holds the lock's name, its
SHA-256 and the extra pins, and a venv is made anew only when that line differs.

Making anew clears the folder (`python3 -m venv --clear`, python3 from PATH), so it is done only to a
folder this script made: one that holds its stamp. A symlink (a shared environment, another worktree's)
and a folder without the stamp are refused with one line saying what to do; nothing is deleted. The stamp is
written twice: "building ..." once the venv exists (so a failed install is still known as the
project's and is made anew next time) and the full line when every step succeeded.

Standard library only: it runs before either environment exists.
"""

import argparse
import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

STAMP = ".installed"


def stamp_line(lock: Path, also: list[str]) -> str:
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    return " ".join([str(lock), f"sha256={digest}", *also])


def read_stamp(venv: Path) -> str | None:
    try:
        return (venv / STAMP).read_text().strip()
    except OSError:
        return None


def interpreter_setting(venv: Path) -> str:
    """.venv-quant -> QUANT_PY: the make setting that brings an interpreter of one's own instead."""
    return venv.name.removeprefix(".venv-").upper() + "_PY"


def refusal(venv: Path) -> str | None:
    """Why VENV must not be cleared, or None when it may be (absent, empty, or made by this script)."""
    instead = f"or bring your own interpreter: {interpreter_setting(venv)}=/path/to/python on make's command line"
    if venv.is_symlink():
        return (
            f"{venv} is a link (to {os.path.realpath(venv)}) and its stamp does not match; make will not clear"
            f" what a link points to. Remove the link and run make setup again, {instead}"
        )
    if not venv.exists():
        return None
    if not venv.is_dir():
        return f"{venv} is not a folder; move it away and run make setup again, {instead}"
    if read_stamp(venv) is None and any(venv.iterdir()):
        return (
            f"{venv} was not made by make setup (it has no {STAMP}); nothing was changed. Move it away or"
            f" remove it and run make setup again, {instead}"
        )
    return None


def run(*cmd: str) -> None:
    print(shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def make(venv: Path, lock: Path, device: str, also: list[str]) -> int:
    wanted = stamp_line(lock, also)
    if read_stamp(venv) == wanted:
        return 0
    # A stamp from before stamps held the hash: the lock's name alone, written after the lock last changed.
    old = venv / STAMP
    if not venv.is_symlink() and read_stamp(venv) == str(lock) and old.stat().st_mtime >= lock.stat().st_mtime:
        old.write_text(wanted + "\n")
        print(f"{venv}: built from {lock} as it is now; its stamp now holds the lock's hash")
        return 0
    why = refusal(venv)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    run("python3", "-m", "venv", "--clear", str(venv))
    (venv / STAMP).write_text(f"building {wanted}\n")
    # --no-deps: the lock files are complete, resolved sets. The CPU locks name PyTorch's CPU wheel index;
    # where it cannot be reached (torch from a local wheel folder) pip would retry it 5 times for every package.
    pip = [str(venv / "bin/pip"), "install", "-q", "--no-deps", *(["--retries", "1"] if device == "cpu" else [])]
    run(*pip, "-r", str(lock))
    if also:
        run(*pip, *also)
    # torch==2.13.0 also admits a local 2.13.0+cpu wheel: check that the venv got the build DEVICE needs.
    cuda = device == "cuda"
    check = f"import torch; assert (torch.version.cuda is not None) == {cuda}, 'DEVICE={device}, ' + torch.__version__"
    run(str(venv / "bin/python"), "-c", check)
    (venv / STAMP).write_text(wanted + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["check", "make"])
    p.add_argument("venv", type=Path)
    p.add_argument("lock", type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--also", nargs="*", default=[], help="pins installed after the lock (also --no-deps)")
    args = p.parse_args(argv)
    if not args.lock.is_file():
        print(f"error: {args.lock}: no such lock file (DEVICE picks requirements/*.lock)", file=sys.stderr)
        return 2
    if args.action == "check":
        print("up-to-date" if read_stamp(args.venv) == stamp_line(args.lock, args.also) else "stale")
        return 0
    try:
        return make(args.venv, args.lock, args.device, args.also)
    except subprocess.CalledProcessError as e:
        print(f"error: {shlex.join(e.cmd)}: exit {e.returncode}; make setup makes {args.venv} anew", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
