"""A Ctrl-C (or SIGTERM) in a stage's first second, while `python -m pipeline.<stage>` is still importing its
libraries, is one line and 130 (143) like every later stop (issue 42; pipeline/exits.py: guard_start).

The import is made slow for real: a sitecustomize on PYTHONPATH holds the import of one module (SLOW_IMPORT)
for a minute, after touching a file, and the signal is sent once that file exists."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import exits
from pipeline.settings import ROOT

from make_runs import ALONE, assert_make_passed_on_the_interrupt

SITECUSTOMIZE = """
import os, sys, time


class SlowImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("SLOW_IMPORT"):
            open(os.environ["SLOW_IMPORT_MARK"], "w").close()
            # short sleeps: a signal that lands after the mark and before one long sleep began would only be
            # handled when it ended (time.sleep checks for signals only once interrupted), as a loaded machine showed
            for _ in range(600):
                time.sleep(0.1)
        return None


sys.meta_path.insert(0, SlowImport())
"""

# (python -m module, its arguments, the module whose import is held, the stage's name in its line): every
# `python -m` entry of the Makefile that runs a stage
ENTRIES = [
    ("pipeline.quantize", ["--model", "m", "--recipe", "r.yaml", "--out", "o"], "pipeline.quantize", "quantize"),
    ("pipeline.evaluate", ["run", "o/m/bf16"], "pydantic", "eval"),
    ("pipeline.evaluate", ["compare", "o/m"], "pipeline.evaluate", "eval"),
    ("pipeline.bench", ["--profile", "bench/cpu.yaml", "o/m/bf16"], "pipeline.bench", "bench"),
    ("pipeline.measure", ["o/m/bf16"], "pipeline.measure", "measure"),
    ("pipeline.report", ["o/m"], "pydantic", "report"),
    ("pipeline.publish", ["publish", "o/m", "--out", "o/published"], "pipeline.publish", "publish"),
    ("pipeline.publish", ["verify", "o/published/m-bf16"], "pipeline.publish", "verify-published"),
    ("pipeline.source", ["embedded", "o/s"], "pipeline.source", "source"),
    ("pipeline.review", ["o/m"], "pipeline.review", "review"),
]


def held_start(tmp_path: Path, module: str, args: list[str], slow: str) -> tuple[subprocess.Popen, Path]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp_path / "importing"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SLOW_IMPORT": slow, "SLOW_IMPORT_MARK": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal's foreground job has it (a background job without job control ignores SIGINT)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while not mark.exists():
        assert proc.poll() is None, f"{module} ended before its import was held: {proc.communicate()}"
        assert time.time() < deadline, f"{module} never imported {slow}"
        time.sleep(0.05)
    return proc, mark


@pytest.mark.parametrize(("module", "args", "slow", "stage"), ENTRIES, ids=[f"{e[3]}-{e[2]}" for e in ENTRIES])
def test_a_ctrl_c_while_a_stage_imports_is_one_line_and_exit_130(tmp_path, module, args, slow, stage):
    proc, _ = held_start(tmp_path, module, args, slow)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    lines = stderr.splitlines()
    assert proc.returncode == exits.INTERRUPTED, stderr[-3000:]
    assert lines == [
        f"{stage}: interrupted (Ctrl-C) while starting (importing its libraries); nothing is written or started yet"
    ], stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["importing", "site"]  # nothing written


def test_a_sigterm_while_a_stage_imports_is_one_line_and_exit_143(tmp_path):
    proc, _ = held_start(tmp_path, "pipeline.report", ["o/m"], "pydantic")
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == exits.TERMINATED, stderr[-3000:]
    assert stderr.splitlines() == [
        "report: stopped (SIGTERM) while starting (importing its libraries); nothing is written or started yet"
    ]


def test_a_ctrl_c_through_make_while_the_stage_imports_is_one_line_and_make_s_own(tmp_path):
    """make report, Ctrl-C to make's whole process group as a terminal sends it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp_path / "importing"
    env = ALONE | {"PYTHONPATH": str(site), "SLOW_IMPORT": "pydantic", "SLOW_IMPORT_MARK": str(mark)}
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "report", f"OUT={tmp_path / 'out'}", f"SERVE_PY={sys.executable}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 60
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = stderr.splitlines()
    assert lines and lines[0] == (
        "report: interrupted (Ctrl-C) while starting (importing its libraries); nothing is written or started yet"
    ), stderr[-3000:]
    assert_make_passed_on_the_interrupt(proc.returncode, lines[1:], "report", exits.INTERRUPTED)
