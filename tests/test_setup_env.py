"""`make setup`'s environments, through make itself in a fresh clone: rebuilt when the lock's content
changes, not when a clone or checkout makes the lock newer, and never cleared through a symlink or over a
folder the project did not make.

No real environment is made: `python3` on make's PATH is a stand-in whose `-m venv --clear DIR` empties
DIR as venv does and puts a logging `pip` and `python` in DIR/bin; every other call runs the real
interpreter. So a run against a Makefile that clears what it should not shows it on tmp_path's
files, and nothing is installed. Milliseconds a case."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.settings import ROOT

# The files under test, as they are in this working tree (a clone has only what is committed).
UNDER_TEST = ["Makefile", "pipeline/settings.py", "pipeline/setting_values.py", "requirements/setup_env.py"]

FAKE_PYTHON3 = textwrap.dedent(
    """\
    #!PYTHON
    import os, shutil, sys
    from pathlib import Path
    args = sys.argv[1:]
    if args[:2] != ["-m", "venv"]:
        os.execv("PYTHON", ["PYTHON", *args])
    with open(os.environ["SETUP_LOG"], "a") as log:
        log.write("venv " + " ".join(args[2:]) + "\\n")
    venv = Path(args[-1])
    if "--clear" in args and venv.is_dir():  # what venv's clear_directory does: the folder's content goes
        for p in venv.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    (venv / "bin").mkdir(parents=True)
    for tool in ("pip", "python"):
        (venv / "bin" / tool).write_text('#!/bin/sh\\necho "%s $*" >> "$SETUP_LOG"\\n' % (venv / "bin" / tool))
        (venv / "bin" / tool).chmod(0o755)
    """
)


@pytest.fixture
def sandbox(tmp_path):
    """A function that makes a fresh clone (lock files as new as the clone) and runs make there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3.replace("PYTHON", sys.executable))
    (bin_dir / "python3").chmod(0o755)
    log = tmp_path / "setup.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "SETUP_LOG": str(log)}

    def clone(name: str) -> Path:
        dest = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
        for rel in UNDER_TEST:
            if (ROOT / rel).exists():
                shutil.copy2(ROOT / rel, dest / rel)
        return dest

    def make(repo: Path, *args: str) -> subprocess.CompletedProcess:
        log.write_text("")
        return subprocess.run(
            ["make", "--no-print-directory", "DEVICE=cpu", *args], cwd=repo, env=env, capture_output=True, text=True
        )

    clone.make = make
    clone.log = log
    return clone


def test_a_symlinked_environment_is_refused_and_its_target_kept(sandbox, tmp_path):
    shared = tmp_path / "shared-venv"  # someone else's environment, or another worktree's
    (shared / "bin").mkdir(parents=True)
    (shared / "keep").write_text("precious")
    (shared / ".installed").write_text("requirements/quant.lock\n")
    os.utime(shared / ".installed", (0, 0))  # older than the clone's lock files
    repo = sandbox("clone")
    (repo / ".venv-quant").symlink_to(shared)

    proc = sandbox.make(repo, ".venv-quant/.installed")

    assert (shared / "keep").read_text() == "precious" and (shared / "bin").is_dir()
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is a link" in errors[0] and "QUANT_PY=" in errors[0], proc.stderr
    assert sandbox.log.read_text() == ""  # no venv, no pip


def test_a_folder_the_project_did_not_make_is_refused(sandbox):
    repo = sandbox("clone")
    (repo / ".venv-serve").mkdir()
    (repo / ".venv-serve" / "notes.txt").write_text("mine")

    proc = sandbox.make(repo, ".venv-serve/.installed")

    assert proc.returncode == 2 and (repo / ".venv-serve" / "notes.txt").read_text() == "mine"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not made by make setup" in errors[0] and "SERVE_PY=" in errors[0], proc.stderr
    assert sandbox.log.read_text() == ""


def test_an_up_to_date_environment_is_not_rebuilt_in_a_fresh_clone(sandbox):
    first = sandbox("first")
    assert sandbox.make(first, "setup").returncode == 0
    assert "venv --clear .venv-quant" in sandbox.log.read_text()
    # a checkout or clone rewrites the lock files: same content, newer than the stamp
    for lock in (first / "requirements").glob("*.lock"):
        os.utime(lock, None)
    proc = sandbox.make(first, "setup")
    assert proc.returncode == 0 and sandbox.log.read_text() == "", proc.stdout + proc.stderr

    # a second clone sharing the first one's (up-to-date) environments through links
    second = sandbox("second")
    (second / ".venv-quant").symlink_to(first / ".venv-quant")
    (second / ".venv-serve").symlink_to(first / ".venv-serve")
    (first / ".venv-quant" / "keep").write_text("x")
    proc = sandbox.make(second, "setup")
    assert proc.returncode == 0 and sandbox.log.read_text() == "", proc.stdout + proc.stderr
    assert (first / ".venv-quant" / "keep").exists()


def test_a_changed_lock_rebuilds_an_environment_the_project_made(sandbox):
    repo = sandbox("clone")
    assert sandbox.make(repo, "setup").returncode == 0
    (repo / ".venv-quant" / "stale-package").write_text("from the old lock")
    lock = repo / "requirements/quant.lock"
    stamp_time = (repo / ".venv-quant/.installed").stat().st_mtime
    lock.write_text(lock.read_text() + "six==1.17.0\n")
    os.utime(lock, (stamp_time - 3600, stamp_time - 3600))  # older than the stamp: content decides, not time

    proc = sandbox.make(repo, "setup")

    assert proc.returncode == 0, proc.stderr
    log = sandbox.log.read_text().splitlines()
    assert "venv --clear .venv-quant" in log
    assert ".venv-quant/bin/pip install -q --no-deps --retries 1 -r requirements/quant.lock" in log
    assert not any(".venv-serve" in line for line in log)  # its lock did not change
    assert not (repo / ".venv-quant" / "stale-package").exists()
    assert sandbox.make(repo, "setup").returncode == 0 and sandbox.log.read_text() == ""  # and now it is current


def test_an_interrupted_build_is_made_anew(sandbox):
    repo = sandbox("clone")
    assert sandbox.make(repo, "setup").returncode == 0
    (repo / ".venv-quant/.installed").write_text("building requirements/quant.lock\n")  # pip failed half-way
    proc = sandbox.make(repo, "setup")
    assert proc.returncode == 0 and "venv --clear .venv-quant" in sandbox.log.read_text(), proc.stderr


def test_a_stamp_from_before_hashes_is_taken_over_without_a_rebuild(sandbox):
    repo = sandbox("clone")
    (repo / ".venv-quant").mkdir()
    (repo / ".venv-quant/.installed").write_text("requirements/quant.lock\n")  # newer than the lock
    (repo / ".venv-serve").mkdir()
    (repo / ".venv-serve/.installed").write_text("requirements/serve.lock\n")
    proc = sandbox.make(repo, "setup")
    assert proc.returncode == 0 and sandbox.log.read_text() == "", proc.stderr
    assert "sha256=" in (repo / ".venv-quant/.installed").read_text()
