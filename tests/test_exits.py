"""Every failure is one line and a non-zero exit, losing nothing (issue 42; pipeline/exits.py): a Ctrl-C in
make eval and make bench, a full disk under make quantize and make publish, each through make as a user
runs it. The Ctrl-C is a real SIGINT to make's whole process group, as a terminal sends it; the full disk is
a real one, a small tmpfs mounted in a user and mount namespace of the test's own (`unshare -rm`, no root).
make adds one line of its own to each ("make: *** [...] Error N"; tests/make_runs.py: a race of make's own)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from pipeline import exits
from pipeline.settings import ROOT

from make_runs import ALONE, assert_make_passed_on_the_interrupt, make_error
from stage_files import write_manifest

needs_vllm = pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (.venv-serve)")


def variant_of(tiny_model: Path, out: Path) -> Path:
    """OUT/tiny-llama/bf16 as make quantize writes it (tests/test_chain.py runs the real one)."""
    variant = out / tiny_model.name / "bf16"
    shutil.copytree(tiny_model, variant, ignore=shutil.ignore_patterns("manifest.json"))
    write_manifest(variant, tiny_model.name, "bf16", random_weights=True)
    return variant


def interrupt_make(args: list[str], ready, timeout_s: float = 600) -> tuple[int, str, list[str]]:
    """make ARGS in a session of its own; once ready(stdout so far) holds, SIGINT to its whole process group
    (a terminal's Ctrl-C). (make's exit status, stdout, stderr lines)."""
    proc = subprocess.Popen(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env=ALONE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as a terminal's foreground job has it: a shell that starts this run in the background (`cmd &`
        # without job control) gives its children SIGINT ignored, and they would never see the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    got = {"out": "", "err": ""}

    def read(stream, key):
        for line in stream:
            got[key] += line

    readers = [
        threading.Thread(target=read, args=(s, k), daemon=True) for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))
    ]
    for t in readers:
        t.start()
    deadline = time.time() + timeout_s
    try:
        while not ready(got["out"]):
            assert proc.poll() is None, f"make ended before the interrupt: {got['out'][-2000:]}{got['err'][-2000:]}"
            assert time.time() < deadline, got["out"][-2000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for t in readers:
        t.join(timeout=10)
    return proc.returncode, got["out"], got["err"].splitlines()


def running_under(folder: Path) -> list[str]:
    """Processes whose command line names `folder` (a server's --model is the variant)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(folder) in part for part in p.info["cmdline"] or []):
            found.append(" ".join(p.info["cmdline"]))
    return found


def assert_interrupted(code: int, lines: list[str], stage: str, what: str, target: str, intact: str) -> None:
    assert lines, "nothing on stderr"
    assert lines[0].startswith(f"{stage}: interrupted (Ctrl-C) while {what}; {intact}"), lines[0]
    assert lines[0].endswith("; nothing of it left running"), lines[0]
    assert_make_passed_on_the_interrupt(code, lines[1:], target, exits.INTERRUPTED)


@pytest.mark.e2e  # a vLLM server's start: half a minute on two cores
@needs_vllm
def test_ctrl_c_in_make_eval_is_one_line_exit_130_and_keeps_the_earlier_results(tmp_path, tiny_model):
    out = tmp_path / "out"
    variant = variant_of(tiny_model, out)
    (variant / "eval").mkdir()
    (variant / "eval/results.json").write_text('{"earlier": true}')
    # interrupted while the server generates (the suites' items, at their max_tokens, take a while)
    code, stdout, lines = interrupt_make(
        ["eval-bf16", f"MODEL={tiny_model}", f"OUT={out}"], lambda stdout: "server up in" in stdout
    )
    intact = "its earlier eval/ is untouched and nothing is half-written: eval/ is moved in only when complete"
    assert_interrupted(code, lines, "eval", f"evaluating {variant}", "eval-bf16", intact)
    assert (variant / "eval/results.json").read_text() == '{"earlier": true}'
    assert not [p.name for p in variant.iterdir() if p.name.startswith(".")]  # no staging folder left
    assert running_under(variant) == []


@pytest.mark.e2e  # a vLLM server's start: half a minute on two cores
@needs_vllm
def test_ctrl_c_in_make_bench_is_one_line_exit_130_and_keeps_the_earlier_bench(tmp_path, tiny_model):
    out = tmp_path / "out"
    variant = variant_of(tiny_model, out)
    (variant / "bench.json").write_text('{"earlier": true}')
    client_log = variant.parent / ".bench-bf16.client.log"  # vLLM's benchmark client, in bench's own process
    code, stdout, lines = interrupt_make(
        ["bench", f"MODEL={tiny_model}", f"OUT={out}", "BENCH_RECIPES=bf16", "BENCH_PROFILE=cpu-test"],
        lambda stdout: client_log.exists(),
    )
    intact = "its own earlier bench.json untouched: bench.json is written only when a bench is over; its capacity"
    assert_interrupted(code, lines, "bench", f"benchmarking {variant}", "bench", intact)
    assert (variant / "bench.json").read_text() == '{"earlier": true}'
    assert running_under(variant) == []


def test_ctrl_c_in_make_quantize_is_one_line_exit_130_and_keeps_the_earlier_build(tmp_path, tiny_model):
    pytest.importorskip("llmcompressor")  # quantize's environment: the test runs there once
    out = tmp_path / "out"
    earlier = out / tiny_model.name / "bf16"
    earlier.mkdir(parents=True)
    (earlier / "earlier.txt").write_text("earlier")
    code, stdout, lines = interrupt_make(
        ["quantize", "RECIPES=bf16", f"MODEL={tiny_model}", f"OUT={out}"],
        lambda stdout: any(p.name.startswith(".tmp-bf16-") for p in earlier.parent.iterdir()),
    )
    intact = "an earlier build of it is untouched and nothing is half-written: a variant is moved in only when complete"
    assert_interrupted(code, lines, "quantize", f"building {earlier}", "quantize-bf16", intact)
    assert [p.name for p in earlier.parent.iterdir()] == ["bf16"] and (earlier / "earlier.txt").read_text() == "earlier"
    assert running_under(tmp_path) == []


def test_ctrl_c_in_make_pull_is_one_line_exit_130_and_creates_nothing(tmp_path):
    """The puller runs alone (the serving image's puller), so it does this in itself: against a store that
    takes the connection and never answers."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    out = tmp_path / "out"
    endpoint = f"AWS_ENDPOINT_URL=http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        code, stdout, lines = interrupt_make(
            ["pull", "REGISTRY=s3://bucket/prefix", "MODEL=org/tiny", f"OUT={out}", endpoint], lambda _: accepted
        )
    finally:
        listener.close()
    assert lines, "nothing on stderr"
    assert lines[0] == (
        "pull: interrupted (Ctrl-C) while pulling s3://bucket/prefix version latest; nothing is created: a pull is "
        "moved in only once every file is verified, and the partial download is removed"
    )
    assert_make_passed_on_the_interrupt(code, lines[1:], "pull", exits.INTERRUPTED)
    assert not out.exists()


# ------------------------------------------------------------------------------------ a full disk
FULL_LINE = r"[\d.]+ (bytes|KiB|MiB) free there now, it needs about [\d.]+ MiB; earlier outputs are untouched"


def in_small_disk(script: str, mount: Path, size: str, **env: str) -> subprocess.CompletedProcess:
    """`script` (sh) in a user and mount namespace where `mount` is a tmpfs of `size`: a disk that fills."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)])
    if probe.returncode:
        pytest.skip("needs unprivileged user and mount namespaces (unshare -rm) to mount a small tmpfs")
    line = f'mount -t tmpfs -o size={size} tmpfs "$MOUNT" && {script}'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", line],
        cwd=ROOT,
        env=ALONE | env | {"MOUNT": str(mount)},
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_full_disk_in_make_quantize_is_one_line_and_keeps_the_earlier_variant(tmp_path, tiny_model):
    pytest.importorskip("llmcompressor")  # quantize's environment: the test runs there once
    out = tmp_path / "out"
    out.mkdir()
    # The disk fills while the variant is written, as another writer would fill it: quantize's own check of
    # the free space (checks.check_disk) passes before the build starts.
    script = """
        mkdir -p "$OUT/tiny-llama/bf16" && echo earlier > "$OUT/tiny-llama/bf16/earlier.txt"
        make --no-print-directory quantize RECIPES=bf16 MODEL="$MODEL" OUT="$OUT" & pid=$!
        until ls -d "$OUT"/tiny-llama/.tmp-bf16-* >/dev/null 2>&1 || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
        dd if=/dev/zero of="$OUT/someone-elses" bs=1M 2>/dev/null
        wait $pid; echo "make: $?"; ls -A "$OUT/tiny-llama"; cat "$OUT/tiny-llama/bf16/earlier.txt"
    """
    proc = in_small_disk(script, out, "120m", OUT=str(out), MODEL=str(tiny_model))
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"quantize: {out}/tiny-llama: no space left on device while writing bf16: "), lines[0]
    assert re.search(FULL_LINE, lines[0]), lines[0]
    assert make_error("quantize-bf16", 1).fullmatch(lines[1]), lines[1]
    assert proc.stdout.splitlines()[-3:] == ["make: 2", "bf16", "earlier"], proc.stdout  # no .tmp-bf16-* left


def test_a_full_disk_in_make_publish_is_one_line_and_keeps_the_earlier_folders(tmp_path, tiny_model):
    pytest.importorskip("matplotlib")  # the report's plots: the serve environment
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    model_dir = tiny_model_dir(tmp_path, tiny_model)
    policy = write_policy(tmp_path, max_tpot=55, max_drop=0.0)  # bf16 qualifies
    report(model_dir, policy)
    published = model_dir.parent / "published"
    published.mkdir()
    script = """
        mkdir "$MOUNT/tiny-earlier" && echo earlier > "$MOUNT/tiny-earlier/README.md"
        make --no-print-directory publish MODEL=org/tiny OUT="$OUT" POLICY="$POLICY"
        echo "make: $?"; ls -A "$MOUNT"; cat "$MOUNT/tiny-earlier/README.md"
    """
    # the tiny checkpoint is 12.6 MB
    proc = in_small_disk(script, published, "4m", OUT=str(model_dir.parent), POLICY=str(policy))
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"publish: {published}: no space left on device while writing tiny-bf16: "), lines[0]
    assert re.search(FULL_LINE, lines[0]), lines[0]
    assert make_error("publish", 1).fullmatch(lines[1]), lines[1]
    assert proc.stdout.splitlines()[-3:] == ["make: 2", "tiny-earlier", "earlier"], proc.stdout


# ------------------------------------------------------------------------------------ the parts
def test_a_ctrl_c_while_outputs_move_into_place_waits_until_all_of_them_have():
    moved = []
    # Python's own Ctrl-C handler, whatever this run was started with (a background job ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with exits.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)  # the signal has arrived by now: held back
                moved.append("all")
    finally:
        signal.signal(signal.SIGINT, before)
    assert moved == ["all"]


def test_a_ctrl_c_is_one_line_even_where_the_interrupted_work_leaves_objects_that_fail_as_they_are_collected():
    """An asyncio loop of vLLM's benchmark client, cut off mid-request in make bench's process, printed
    "Exception ignored in: <function BaseEventLoop.__del__ ...>" and a traceback before bench's line (a clean
    clone's make test, 2026-12-07). Here a stand-in whose __del__ and __repr__ fail, freed as the interrupt
    unwinds main(): the one line still comes alone."""
    script = """
import os, signal, sys, time
from pipeline import exits

class HalfBuilt:
    def __repr__(self):
        raise RuntimeError("no repr: its state was never set")
    def __del__(self):
        raise RuntimeError(f"unclosed {self!r}")

def main():
    exits.doing("waiting for a client")
    work = HalfBuilt()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    return 0

exits.run("bench", main, "nothing is written")
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground job
    )
    assert proc.returncode == exits.INTERRUPTED, proc.stderr
    assert proc.stderr.splitlines() == [
        "bench: interrupted (Ctrl-C) while waiting for a client; nothing is written; nothing of it left running"
    ]


def test_a_full_disk_is_recognised_in_the_errors_libraries_raise_for_it():
    assert exits.disk_full(OSError(28, "No space left on device")) == 28
    safetensors = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert exits.disk_full(safetensors) == 28
    try:
        try:
            raise OSError(122, "Disk quota exceeded")
        except OSError as e:
            raise RuntimeError("save failed") from e
    except RuntimeError as e:
        assert exits.disk_full(e) == 122
    assert exits.disk_full(ValueError("no")) is None


def test_write_json_on_a_full_disk_names_the_folder_and_leaves_the_old_file(tmp_path, monkeypatch):
    """The write boundary itself (the stages' tests above fill a real disk)."""
    from pipeline import staging

    path = tmp_path / "bench.json"
    path.write_text('{"old": true}')

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(staging.Path, "replace", full)
    with pytest.raises(exits.DiskFull) as e:
        staging.write_json(path, {"new": True})
    assert str(e.value).startswith(f"{tmp_path}: no space left on device while writing bench.json: ")
    assert json.loads(path.read_text()) == {"old": True} and [p.name for p in tmp_path.iterdir()] == ["bench.json"]
