"""Make settings reach the shell safely: names are checked before any command is built, paths are
quoted, and yes/no settings mean yes only when they say so. `make -n` prints the commands without
running them, so these take milliseconds."""

import subprocess

import pytest

from pipeline.settings import ROOT


def make_n(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize(
    "setting, value",
    [
        ("RECIPES", "bf16;touch${IFS}/tmp/pwned;"),
        ("RECIPES", "bf16 ../x"),
        ("SUITES", "gsm8k|id"),
        ("BENCH_RECIPES", "bf16&&id"),
        ("CALIB", "x;id"),
        ("BENCH_PROFILE", "cpu;id"),
        ("LIMIT", "3;id"),
        ("SEEDS", "0 1;id"),
    ],
)
def test_a_name_with_shell_characters_is_refused_before_any_command(tmp_path, setting, value):
    target = {"SUITES": "eval", "LIMIT": "eval", "SEEDS": "eval", "BENCH_RECIPES": "bench", "BENCH_PROFILE": "bench"}
    proc = make_n(target.get(setting, "quantize"), f"{setting}={value}")
    assert proc.returncode == 2
    assert f"{setting}=" in proc.stderr and "are allowed" in proc.stderr
    assert proc.stdout == ""  # nothing was even printed, let alone run


@pytest.mark.parametrize(
    "value, forced",
    [("", False), ("0", False), ("no", False), ("false", False), ("1", True), ("yes", True), ("true", True)],
)
def test_force_means_yes_only_when_it_says_yes(value, forced):
    quantize = make_n("quantize", "RECIPES=bf16", f"FORCE={value}")
    publish = make_n("publish", f"FORCE_PUBLISH={value}")
    assert quantize.returncode == publish.returncode == 0
    assert ("--force" in quantize.stdout) == forced and ("--force" in publish.stdout) == forced


def test_a_yes_no_typo_is_refused():
    proc = make_n("quantize", "FORCE=ture")
    assert proc.returncode == 2 and "FORCE=ture: use 1 (yes) or 0 (no)" in proc.stderr


def test_paths_with_spaces_stay_one_argument(tmp_path):
    model = tmp_path / "my model"
    proc = make_n(
        "quantize",
        "report",
        "RECIPES=bf16",
        f"MODEL={model}",
        f"OUT={tmp_path}/out dir",
        "POLICY=policies/default.yaml",
    )
    assert proc.returncode == 0
    assert '--model "$MODEL"' in proc.stdout and '--out "$OUT"' in proc.stdout
    assert 'pipeline.report "$OUT/$(basename "$MODEL")" --policy "$POLICY"' in proc.stdout
    # and the shell gives the stage exactly one argument per path
    line = next(l for l in proc.stdout.splitlines() if "pipeline.report" in l)
    words = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + line.split("pipeline.report", 1)[1]],
        env={"MODEL": str(model), "OUT": f"{tmp_path}/out dir", "POLICY": "policies/default.yaml"},
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert words == [f"{tmp_path}/out dir/my model", "--policy", "policies/default.yaml"]
