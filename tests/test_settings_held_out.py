"""Settings checked before any command (issue 42, held-out members of the class): a path with a stray space
at an end, OUT that is a file or a dangling link, VERSION of two words. Each is one line from make, exit 2,
and nothing run (make -n prints no command)."""

import os
import subprocess

import pytest

from pipeline.settings import ROOT


def make_n(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, env=env
    )


def refused(proc: subprocess.CompletedProcess, line: str) -> None:
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == f"Makefile:44: *** {line}.  Stop.\n", proc.stderr


@pytest.mark.parametrize("target", ["clean", "quantize", "report"])
@pytest.mark.parametrize(
    "value", ["artifacts/sources/smollm2-135m-instruct ", "org/my model "]
)  # make strips leading ones
def test_a_path_with_a_space_at_an_end_is_refused(target, value):
    refused(make_n(target, f"MODEL={value}"), f"MODEL='{value}': begins or ends with a space; remove it")


def test_other_path_settings_with_a_space_at_an_end_are_refused_too(tmp_path):
    refused(
        make_n("report", "POLICY=policies/default.yaml "),
        "POLICY='policies/default.yaml ': begins or ends with a space; remove it",
    )
    refused(make_n("clean", f"OUT={tmp_path} "), f"OUT='{tmp_path} ': begins or ends with a space; remove it")


def test_a_path_with_a_space_inside_is_still_one_path(tmp_path):
    proc = make_n("clean", f"OUT={tmp_path}/with space", "MODEL=org/my model")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].endswith('rm -rf "$OUT/$name"')


@pytest.mark.parametrize("target", ["clean", "quantize", "publish"])
def test_out_that_is_a_file_or_a_dangling_link_is_refused(tmp_path, target):
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out in (tmp_path / "a-file", tmp_path / "dangling"):
        refused(make_n(target, f"OUT={out}"), f"OUT={out}: not a folder; set OUT to a folder (made if missing)")
    assert (tmp_path / "a-file").read_text() == "not a folder\n"
    assert make_n(target, f"OUT={tmp_path / 'made-when-missing'}").returncode == 0
    (tmp_path / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert make_n(target, f"OUT={tmp_path / 'linked'}").returncode == 0  # a link to a folder is that folder


def test_a_version_of_two_words_is_refused():
    refused(
        make_n("pull", "REGISTRY=s3://b/p", "VERSION=abc def"),
        "VERSION=abc def: expected a version (16 hex digits) or an alias, e.g. latest",
    )


@pytest.mark.parametrize("name", ["sources", "published", "pulled"])
def test_a_model_named_as_one_of_out_s_own_folders_is_refused(name):
    """make clean MODEL=org/pulled would remove OUT/pulled/, every pull (mutation audit: 'pulled' left out of
    the reserved names passed every test)."""
    refused(
        make_n("clean", f"MODEL=org/{name}"),
        f"MODEL=org/{name}: a model named {name!r} would share OUT/{name}/ with the pipeline's own {name}; "
        "rename its folder",
    )


@pytest.mark.parametrize(("port", "ok"), [("65535", True), ("65536", False), ("1", True)])
def test_a_port_is_taken_up_to_65535_and_no_further(port, ok):
    """The top of the range (mutation audit: a bound of 65536 passed every test)."""
    proc = make_n("review", f"REVIEW_PORT={port}")
    if ok:
        assert proc.returncode == 0, proc.stderr
    else:
        refused(proc, f"REVIEW_PORT={port}: expected a TCP port, one whole number from 1 to 65535")
