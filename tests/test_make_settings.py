"""Make settings reach the shell safely: names are checked (pipeline/settings.py) before any command is
built, paths are quoted, and yes/no settings mean yes only when they say so. `make -n` prints the commands without
running them, so these take milliseconds."""

import os
import subprocess

import pytest

from pipeline import settings
from pipeline.settings import ROOT


def make_n(*args: str) -> subprocess.CompletedProcess:
    """make -n as a user types it: without the jobserver of a make test around it (whose warning is a line)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    command = ["make", "-n", "--no-print-directory", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)


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
    "target, setting, value, repeated",
    [
        ("eval", "SEEDS", "0 0", "0"),  # issue 42: 10 generations for a 5-item suite, reported as seeds=2
        ("eval", "SEEDS", "1 2 01", "1"),  # one seed by value
        ("quantize", "RECIPES", "bf16 gptq-w4a16 bf16", "bf16"),
        ("eval", "SUITES", "synthetic-math synthetic-rc synthetic-math", "synthetic-math"),
        ("bench", "BENCH_RECIPES", "bf16 bf16", "bf16"),
    ],
)
def test_a_list_setting_with_a_member_given_twice_is_refused_before_any_command(target, setting, value, repeated):
    proc = make_n(target, f"{setting}={value}")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1
    assert f"{setting}={value}: {repeated} is given twice; give each once" in proc.stderr


def test_a_list_setting_of_distinct_members_reaches_the_command():
    assert "--seeds 0 1 2" in make_n("eval", "RECIPES=bf16", "SEEDS=0 1 2").stdout


@pytest.mark.parametrize("model", ["/", "", "x/..", "some/where/.", "/data/published", "models/sources/", ".hidden"])
@pytest.mark.parametrize("target", ["clean", "quantize", "publish"])
def test_a_model_whose_last_part_is_not_a_models_own_folder_is_refused_before_any_command(tmp_path, model, target):
    """MODEL=$DIR/ with DIR unset made `make clean` remove OUT//: every model, published folder and source."""
    out = tmp_path / "out"
    (out / "keep").mkdir(parents=True)
    alone = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }  # not make test's -j4
    argv = ["make", "--no-print-directory", target, f"MODEL={model}", f"OUT={out}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=alone)
    assert proc.returncode == 2 and f"MODEL={model}: " in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert (out / "keep").is_dir()


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


def make_env(name: str, *args: str, env: dict | None = None) -> str:
    """The value make hands every command for `name`."""
    show = f'frame-show: ; @echo "$${name}"'
    proc = subprocess.run(
        ["make", "--no-print-directory", "--eval", show, "frame-show", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in (env or os.environ).items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_tools_environment_has_one_default_and_the_users_value_wins():
    clean = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    assert make_env("VLLM_CPU_KVCACHE_SPACE", env=clean) == settings.VLLM_CPU_KVCACHE_SPACE
    assert make_env("VLLM_CPU_KVCACHE_SPACE", env=clean | {"VLLM_CPU_KVCACHE_SPACE": "3"}) == "3"
    assert make_env("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE=4", env=clean) == "4"


def test_verbose_turns_the_stages_quiet_mode_off():
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_QUIET"}  # make test exports it
    assert make_env("PIPELINE_QUIET", env=env) == "1"
    assert make_env("PIPELINE_QUIET", "VERBOSE=1", env=env) == ""


def test_out_and_the_interpreters_come_from_the_command_line_only():
    env = os.environ | {"OUT": "/elsewhere", "SERVE_PY": "/elsewhere/python"}
    assert make_env("OUT", env=env) == "artifacts"
    assert make_env("SERVE_PYTHON", env=env) == str(ROOT / ".venv-serve/bin/python")
    assert make_env("OUT", "OUT=/mine", env=env) == "/mine"


def test_defaults_follow_the_settings_they_derive_from():
    values = settings.resolve({"DATA_DIR": ("command line", "/data"), "BENCH_PROFILE": ("command line", "cpu")})
    assert values["CALIB"] == "gsm8k-train-chat" and values["SUITES"].split()[0] == "gsm8k"
    values = settings.resolve({"RECIPES": ("environment", "bf16 fp8-dynamic")})
    assert values["BENCH_RECIPES"] == "bf16" and values["BASE_MODEL"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert settings.resolve({"MODEL": ("command line", "org/name")})["BASE_MODEL"] == "org/name"


def test_the_settings_page_s_table_is_the_settings_table():
    assert settings.markdown_table() in (ROOT / "docs" / "settings.md").read_text()


def test_make_help_lists_every_setting_with_its_value_now():
    proc = subprocess.run(["make", "--no-print-directory", "help", "LIMIT=7"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert all(s.name in lines for s in settings.SETTINGS)
    assert lines["LIMIT"].endswith("[7]")


def test_a_stage_reads_a_shared_default_from_the_table():
    assert settings.default("POLICY") == "policies/default.yaml" and settings.default("REVIEW_PORT") == "7860"
    assert settings.default("CALIB") == "synthetic-math-chat"  # derived: DATA_DIR unset


def test_settings_need_only_the_standard_library_and_do_nothing_on_import():
    # make runs it with the system python3, before either environment exists: -S leaves site-packages out
    code = "import os, pipeline.settings; print(sorted(os.environ) == sorted(before))"
    proc = subprocess.run(
        ["python3", "-S", "-c", f"import os; before = dict(os.environ); {code}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_an_nvidia_smi_that_hangs_is_given_up_on_in_one_line(tmp_path, monkeypatch, capsys):
    """DEVICE's default asks `nvidia-smi -L`, which a wedged driver never answers: make's every command
    computes the settings first, so it would hang all of them."""
    import time

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec sleep 120\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(settings, "NVIDIA_SMI_S", 1)
    settings._gpu_listed.cache_clear()
    t0 = time.monotonic()
    try:
        assert settings._device({}) == "cpu"
    finally:
        settings._gpu_listed.cache_clear()
    assert time.monotonic() - t0 < 5
    assert capsys.readouterr().err == (
        f"{fake} -L: no answer in 1 s (its driver hangs): DEVICE=cpu; set DEVICE=cuda for the GPU's\n"
    )


@pytest.mark.parametrize(
    "target, setting, value, expected",
    [
        ("bench", "BENCH_PORT", "abc", "a TCP port, one whole number from 1 to 65535"),  # issue 42: a traceback
        ("review", "REVIEW_PORT", "70000", "a TCP port, one whole number from 1 to 65535"),
        ("eval", "LIMIT", "0", "one whole number of at least 1"),
        ("eval", "LIMIT", "5 6", "one whole number of at least 1"),
        ("eval", "SAMPLES", "0", "one whole number of at least 1"),
        ("bench", "TP", "0", "one whole number of at least 1"),
        ("eval", "ENDPOINT_CONCURRENCY", "", "one whole number of at least 1"),
        ("bench", "BENCH_TIME_LIMIT", "0", "one whole number of seconds, at least 1"),
        ("eval", "EVAL_DTYPE", "fp3", "one of vLLM's dtypes: auto, half, float16, bfloat16, float, float32"),
        ("help", "SMOKE_DTYPE", "bf16", "one of vLLM's dtypes: auto, half, float16, bfloat16, float, float32"),
        ("report", "POLICY", "policies/none.yaml", "an existing file"),
        ("eval", "DATA_DIR", "/no/such/data", "an existing folder"),
        ("report", "SERVE_PY", "/no/such/python", "a python interpreter that exists and can be run"),
        ("publish", "REGISTRY", "ftp://host/x", "s3://bucket/prefix or hf://org/name"),
        ("pull", "VERSION", "", "a version (16 hex digits) or an alias, e.g. latest"),
        ("help", "DEVICE", "tpu", "cpu or cuda"),
        ("bench", "BENCH_PROFILE", "cpu h200", "one name of bench/*.yaml: cpu cpu-test"),
        ("bench", "BENCH_PROFILE", "nope", "names of bench/*.yaml: cpu cpu-test"),
        ("eval", "SUITES", "synthetic-math gsm8k-typo", "names of eval/*.yaml: aime24"),
        ("eval", "RECIPES", "bf16 gptq", "names of recipes/*.yaml: autoround-w4a16"),
        ("eval", "SUITES", "", "at least one name of eval/*.yaml; unset, it is synthetic-math"),
        ("bench", "BENCH_RECIPES", "", "at least one name of recipes/*.yaml; unset, it is bf16"),
    ],
)
def test_a_value_that_is_not_what_its_setting_takes_is_one_line_before_any_command(
    tmp_path, target, setting, value, expected
):
    """Through make as a user runs it (not -n): nothing runs, nothing is written under OUT. Each target fails
    fast where the check is missing: none starts long work on a value it would refuse later."""
    out = tmp_path / "out"
    argv = ["make", "--no-print-directory", target, f"{setting}={value}", f"OUT={out}", "REGISTRY=s3://b/p"]
    if setting == "REGISTRY":
        argv.remove("REGISTRY=s3://b/p")
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=make_alone())
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"*** {setting}={value}: " in proc.stderr and f"expected {expected}" in proc.stderr, proc.stderr
    assert not out.exists()


def test_an_environment_setting_a_stage_reads_is_checked_there_too():
    """BENCH_PORT exported, the stage run by hand (no make to check it first): one line, exit 2."""
    env = os.environ | {"BENCH_PORT": "abc"}
    proc = subprocess.run(
        [settings.serve_python(), "-m", "pipeline.bench", "--profile", "bench/cpu.yaml", "artifacts/none/bf16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "bench: BENCH_PORT=abc: expected a TCP port, one whole number from 1 to 65535\n"


def test_the_makefile_passes_every_environment_setting_make_checks():
    line = next(l for l in (ROOT / "Makefile").read_text().splitlines() if l.startswith("CHECKED_ENVIRONMENT :="))
    assert line.split(":=")[1].split() == list(settings.ENVIRONMENT_CHECKS)


def make_alone() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
