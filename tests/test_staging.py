"""A run killed while it moves a finished output into place loses nothing, and two writers of one JSON
file never mix their bytes: real processes, killed with SIGKILL at the point in question."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pipeline.settings import ROOT
from pipeline.staging import remove_stale

# A build through staging_dir in a child process that SIGKILLs itself just before one of its renames:
# the one whose target is `dest` while `dest` is missing (the old variant moved aside, the new one not
# yet in), or the one that moves the old variant aside.
KILLED_BUILD = """
import os, signal, sys
from pathlib import Path
from pipeline.staging import staging_dir

dest, point = Path(sys.argv[1]), sys.argv[2]
rename = Path.rename

def rename_or_die(self, target):
    target = Path(target)
    if point == "into-place" and target == dest and not dest.exists():
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "aside" and self == dest:
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(self, target)

Path.rename = rename_or_die
with staging_dir(dest) as tmp:
    (tmp / "weights").write_text("new")
    (tmp / "manifest.json").write_text("{}")
"""


def killed_build(dest: Path, point: str) -> None:
    dest.mkdir(parents=True)
    (dest / "weights").write_text("old")
    proc = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(dest), point], cwd=ROOT, timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_a_kill_between_the_renames_leaves_the_new_variant_for_the_next_run(tmp_path):
    dest = tmp_path / "tiny/gptq-w4a16"
    killed_build(dest, "into-place")
    assert not dest.exists()  # killed where the issue says: the old one aside, the new one not yet in
    remove_stale(dest.parent)  # what the next run of any stage does first
    assert (dest / "weights").read_text() == "new" and (dest / "manifest.json").is_file()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["gptq-w4a16"]


def test_a_kill_before_the_old_variant_moves_aside_keeps_it(tmp_path):
    dest = tmp_path / "tiny/gptq-w4a16"
    killed_build(dest, "aside")
    remove_stale(dest.parent)
    assert (dest / "weights").read_text() == "old"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["gptq-w4a16"]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_an_old_variant_moved_aside_is_restored_when_nothing_complete_replaced_it(tmp_path):
    # a kill between the renames of a build not marked complete: the old variant aside and a .tmp
    # folder that may be half written
    pid = dead_pid()
    old, half = tmp_path / f".old-bf16-{pid}", tmp_path / f".tmp-bf16-{pid}-x1y2"
    for folder, text in ((old, "old"), (half, "half")):
        folder.mkdir()
        (folder / "weights").write_text(text)
    remove_stale(tmp_path)
    assert (tmp_path / "bf16/weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16"]


# Writes the same file 300 times, each time a whole document of its own (about 200 kB).
WRITER = """
import sys
from pathlib import Path
from pipeline.staging import write_json

path, me = Path(sys.argv[1]), sys.argv[2]
for i in range(300):
    write_json(path, {"writer": me, "i": i, "payload": [me * 100] * 2000})
"""


def test_two_writers_of_one_json_file_never_mix_or_fail(tmp_path):
    path = tmp_path / "bench.json"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), me], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for me in "ab"
    ]
    seen = set()
    while any(w.poll() is None for w in writers):
        if path.exists():
            data = json.loads(path.read_text())  # a reader sees one whole document, never a mix
            assert data["payload"] == [data["writer"] * 100] * 2000
            seen.add(data["writer"])
    errors = [w.stderr.read() for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert json.loads(path.read_text())["i"] == 299
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temp file left behind


def test_a_killed_writers_temp_file_is_removed_by_the_next_run(tmp_path):
    stale, live = tmp_path / f".bench.json.{dead_pid()}-ab12cd34.tmp", tmp_path / f".bench.json.{os.getpid()}-0.tmp"
    stale.write_text("{")
    live.write_text("{")
    assert remove_stale(tmp_path) == [stale]
    assert live.exists()
