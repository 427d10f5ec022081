"""Runaway and broken input: every YAML input, data file and stage output that cannot be used is one line
naming the file (and the line or key), before long work, in bounded time and memory."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.data import load_items
from pipeline.quantize.calibration_samples import calibration_texts
from pipeline.schema import CalibSet, ConfigError, load_recipe, load_suite
from pipeline.settings import ROOT

from stage_files import bench_record, eval_report, eval_results, variant_manifest


def one_line_error(call, *args) -> str:
    with pytest.raises(ConfigError) as e:
        call(*args)
    message = str(e.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------ YAML
def alias_bomb(depth: int = 9, width: int = 9) -> str:
    """`description: *i`, where each anchor repeats the one before nine times: 9^9 strings when expanded."""
    names = "abcdefghi"[:depth]
    lines = [f"x{names[0]}: &{names[0]} [{', '.join(['lol'] * width)}]"]
    lines += [f"x{n}: &{n} [{', '.join([f'*{p}'] * width)}]" for p, n in zip(names, names[1:])]
    return "\n".join(lines) + f"\ndescription: *{names[-1]}\n"


# Each kind of YAML input, read by its stage's loader (with the keys that make the bomb the first error
# a validator would echo), and a published serve.yaml, which review and verify-published read.
LOADERS = {
    "recipe": ("load_recipe", "method: bf16\nbackend: transformers\n"),
    "calib": ("load_calib", "generator: arithmetic-word-problems\nnum_samples: 8\nmax_seq_len: 64\n"),
    "suite": ("load_suite", "generator: reading-passages\nnum_items: 3\nprompt: '{question}'\nmetric: squad\n"),
    "policy": ("load_policy", "objective: [{minimize: size_gib}]\n"),
    "profile": ("load_profile", "shapes: []\nconcurrency: [1]\nmax_model_len: 64\nmax_num_seqs: 1\n"),
    "serve.yaml": ("load_yaml_file", ""),
}

# In a child process under an address-space cap: a regression raises MemoryError or times out there
# instead of taking the machine's memory.
BOUNDED_LOAD = """
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from pipeline import schema
try:
    getattr(schema, sys.argv[1])(Path(sys.argv[2]))
except schema.ConfigError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("kind", LOADERS)
def test_an_alias_bomb_is_refused_in_a_second_with_one_line(tmp_path, kind):
    loader, keys = LOADERS[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(alias_bomb() + keys)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", BOUNDED_LOAD, loader, str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{loader} expanded the aliases of {path.name}: still running after 30 s")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr.startswith(f"{path}: its aliases (*name) expand to ") and proc.stderr.count("\n") == 1
    assert len(proc.stderr) < 300


def aliases_over_the_file_by(excess: int) -> str:
    """A YAML file whose aliases expand to exactly len(file) + MAX_ALIAS_EXPANSION + excess characters (as
    schema.expanded_size counts: one per node plus each scalar's characters): `k: &v <999 x>` and a list
    of 101 `*v`, a comment making up the difference."""
    from pipeline.schema.common import MAX_ALIAS_EXPANSION

    body = f"k: &v {'x' * 999}\nl: [{', '.join(['*v'] * 101)}]\n"
    size = 1 + 2 + 1000 + 2 + 1 + 101 * 1000  # mapping, "k", the anchored scalar, "l", the list, 101 aliases
    pad = size - len(body) - MAX_ALIAS_EXPANSION - excess  # characters a comment adds to the file, not to size
    assert pad >= 2  # "#" and the newline
    return body + "#" + "y" * (pad - 2) + "\n"


def test_the_alias_guard_refuses_one_character_over_its_limit_and_loads_one_at_it(tmp_path):
    import yaml

    from pipeline.schema import load_yaml_file
    from pipeline.schema.common import MAX_ALIAS_EXPANSION, expanded_size

    path = tmp_path / "bomb.yaml"
    for excess in (1, 0, -1):
        path.write_text(text := aliases_over_the_file_by(excess))
        assert expanded_size(yaml.compose(text)) == len(text) + MAX_ALIAS_EXPANSION + excess
    path.write_text(aliases_over_the_file_by(1))
    size = len(path.read_text()) + MAX_ALIAS_EXPANSION + 1
    assert one_line_error(load_yaml_file, path) == (
        f"{path}: its aliases (*name) expand to {size:,} characters, more than the file's "
        f"{len(path.read_text()):,} + {MAX_ALIAS_EXPANSION:,}; write the values out or alias fewer"
    )
    for excess in (0, -1):  # at the limit and just under it: read
        path.write_text(aliases_over_the_file_by(excess))
        assert len(load_yaml_file(path)["l"]) == 101


def test_a_few_aliases_still_load(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("x: &d a recipe\nmethod: bf16\nbackend: transformers\ndescription: *d\n")
    assert "x: unknown key" in one_line_error(load_recipe, path)  # read, aliases resolved, then validated
    path.write_text(alias_bomb(depth=3, width=3) + "method: bf16\nbackend: transformers\n")
    assert "description: Input should be a valid string (got [[['lol', 'lol', 'lol'], " in one_line_error(
        load_recipe, path
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("description: &a [*a]\n", ": an alias (*name) contains itself; write the value out"),
        ("description: " + "[" * 20_000 + "]" * 20_000 + "\n", ": nested too deeply to read"),
        ("description: x\ngroup_size: " + "1" * 5000 + "\n", ": line 2: not valid YAML (Exceeds the limit"),
        ("description: 2025-02-30\n", ": line 1: not valid YAML (day is out of range for month)"),
        ("description: x\n[1, 2]: x\n", ": line 2: not valid YAML (a list as a key; keys are names)"),
    ],
    ids=["cycle", "deep", "long-int", "bad-date", "list-key"],
)
def test_yaml_python_cannot_hold_is_one_line(tmp_path, text, expected):
    path = tmp_path / "r.yaml"
    path.write_text(text + "method: bf16\nbackend: transformers\n")
    message = one_line_error(load_recipe, path)
    assert message.startswith(f"{path}{expected}") and len(message) < 300, message[:500]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "description: x\nkv_cache_dtype: " + "b" * 100_000,
            "kv_cache_dtype: Input should be 'auto' or 'fp8' (got 'bbbb",
        ),
        ("description: [" + ", ".join(["lol"] * 5000) + "]", "description: Input should be a valid string (got ['lol"),
        ("description: x\n? " + "c" * 100_000 + "\n: 1", "unknown key; allowed: "),
    ],
    ids=["long-string", "long-list", "long-key"],
)
def test_a_long_value_is_quoted_as_a_bounded_excerpt(tmp_path, text, expected):
    path = tmp_path / "r.yaml"
    path.write_text(f"method: bf16\nbackend: transformers\n{text}\n")
    message = one_line_error(load_recipe, path)
    assert expected in message and len(message) < 600, message[:700]


def test_a_long_figure_name_in_a_policy_is_quoted_bounded(tmp_path):
    from pipeline.schema import load_policy

    path = tmp_path / "p.yaml"
    path.write_text(
        f"description: x\nobjective: [{{minimize: size_gib}}]\nlimits:\n  ? {'z' * 100_000}.bogus\n  : {{max: 1}}\n"
    )
    message = one_line_error(load_policy, path)
    assert "is not a figure the stages write" in message and "100,006 characters" in message
    assert len(message) < 600


# ----------------------------------------------------------------------------------------- data
def data_suite(tmp_path: Path, local_file: str = "set/test.jsonl", prompt: str = "{question}") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"description: x\nlocal_file: {local_file}\nprompt: '{prompt}'\nmetric: exact_match_numeric\n")
    return path


def write_data(tmp_path: Path, data: bytes, name: str = "set/test.jsonl") -> Path:
    path = tmp_path / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


ROW = b'{"question": "q", "answer": "#### 4"}\n'


def test_an_eval_row_missing_its_answer_after_the_first_names_file_and_line(tmp_path):
    # line 7: a blank line before it, so the line is not the record's number
    data = write_data(tmp_path, ROW * 4 + b"\n" + ROW + b'{"question": "q"}\n' + ROW)
    suite = data_suite(tmp_path)
    message = one_line_error(load_items, load_suite(suite), str(tmp_path / "data"), str(suite), None)
    assert message.startswith(f"{suite}: {data}: line 7: field 'answer' is missing (the suite uses it)")
    write_data(tmp_path, ROW * 3 + b'{"question": null, "answer": "#### 4"}\n')
    message = one_line_error(load_items, load_suite(suite), str(tmp_path / "data"), str(suite), None)
    assert message.startswith(f"{suite}: {data}: line 4: field 'question' is null")


def test_eval_data_that_is_not_utf8_names_file_line_and_byte(tmp_path):
    data = write_data(tmp_path, ROW * 2 + b'{"question": "caf\xe9", "answer": "#### 4"}\n')
    suite = data_suite(tmp_path)
    message = one_line_error(load_items, load_suite(suite), str(tmp_path / "data"), str(suite), None)
    assert message.startswith(f"{data}: line 3 (byte {2 * len(ROW) + 17}): not UTF-8 text")


def test_an_empty_eval_data_file_is_named(tmp_path):
    data = write_data(tmp_path, b"\n")
    suite = data_suite(tmp_path)
    message = one_line_error(load_items, load_suite(suite), str(tmp_path / "data"), str(suite), None)
    assert message == f"{suite}: {data} has no records (an empty file); point DATA_DIR at a complete copy"


def squad(qas: list) -> bytes:
    return json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}).encode()


@pytest.mark.parametrize(
    "data, expected",
    [
        (squad([{"id": "a", "question": "q", "answers": [{"text": "x"}]}])[:-9], ": line 1 column "),
        (
            squad([{"id": "a", "question": "q", "answers": []}, {"id": "b", "question": "q"}]),
            ": data[0].paragraphs[0].qas[1]: no 'answers'",
        ),
        (squad([]), ": no questions"),
        (b'{"data": [{"paragraphs": [{"context": "caf\xe9"}]}]}', ": line 1 (byte 42): not UTF-8 text"),
    ],
    ids=["truncated", "no-answers", "empty", "not-utf8"],
)
def test_squad_json_that_is_not_whole_names_file_and_place(tmp_path, data, expected):
    path = write_data(tmp_path, data, "squad/dev.json")
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "description: x\nlocal_file: squad/dev.json\nprompt: '{question}'\nmetric: squad\ngold_field: answers\n"
    )
    message = one_line_error(load_items, load_suite(suite), str(tmp_path / "data"), str(suite), None)
    assert message.startswith(f"{path}{expected}"), message


def test_a_data_format_the_stages_cannot_read_is_refused_by_the_schema(tmp_path):
    assert "local_file: suites read JSON Lines" in one_line_error(load_suite, data_suite(tmp_path, "set/test.parquet"))
    with pytest.raises(ValueError, match="local_file: calibration data is read as JSON Lines"):
        CalibSet(description="t", local_file="set/train.csv", num_samples=2, max_seq_len=64)
    assert "prompt: every {...} names a field" in one_line_error(load_suite, data_suite(tmp_path, prompt="{}"))
    assert "prompt: not a format string" in one_line_error(load_suite, data_suite(tmp_path, prompt="{question"))


def calib_texts(tmp_path: Path, data: bytes):
    write_data(tmp_path, data, "set/train.jsonl")
    spec = CalibSet(description="t", local_file="set/train.jsonl", num_samples=2, max_seq_len=64)
    return one_line_error(calibration_texts, spec, str(tmp_path / "data"), "calib/t.yaml")


def test_calibration_data_errors_name_file_and_line(tmp_path):
    data = tmp_path / "data/set/train.jsonl"
    message = calib_texts(tmp_path, ROW * 3 + b"\n" + b'{"question": "q"}\n')
    assert message.startswith(f"calib/t.yaml: {data}: line 5: field 'answer' is missing, not text")
    message = calib_texts(tmp_path, ROW + b'{"question": "\xff", "answer": "a"}\n')
    assert message.startswith(f"{data}: line 2 (byte {len(ROW) + 14}): not UTF-8 text")
    assert calib_texts(tmp_path, b"") == (
        f"calib/t.yaml: {data} has no records (an empty file); point DATA_DIR at a complete copy"
    )


# ---------------------------------------------------------------------------------- stage outputs
def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def stage_outputs(tmp_path: Path) -> Path:
    """A model folder as make eval and make bench leave it (bf16 only): what make report reads."""
    model_dir = tmp_path / "artifacts/tiny"
    variant = model_dir / "bf16"
    (variant / "eval").mkdir(parents=True)
    (variant / "manifest.json").write_text(json.dumps(variant_manifest("tiny", "bf16"), indent=2))
    suites = {"synthetic-rc": {"file": "eval/synthetic-rc.yaml", "metric": "squad"}}
    (variant / "eval/results.json").write_text(json.dumps(eval_results("tiny", "bf16", suites), indent=2))
    (variant / "bench.json").write_text(json.dumps(bench_record("tiny", "bf16", levels=[], memory={}), indent=2))
    figures = {"synthetic-rc:f1": {"mean": 0.3, "ci95": [0.25, 0.35]}}
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report("tiny", {"bf16": figures}), indent=2))
    return model_dir


def run_stage(module: str, *args) -> subprocess.CompletedProcess:
    """A stage's real command line, in this interpreter (report, publish and review are the serve
    environment's stages: their tests skip where it lacks matplotlib, which report plots with)."""
    if module not in ("pipeline.bench", "pipeline.evaluate"):
        pytest.importorskip("matplotlib")
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "output, stage",
    [
        ("bf16/eval/results.json", "make eval"),
        ("eval-report.json", "make eval"),
        ("bf16/manifest.json", "make quantize"),
        ("bf16/bench.json", "make bench"),
    ],
)
def test_make_report_names_a_stage_output_cut_short_and_the_stage_to_rerun(tmp_path, output, stage):
    model_dir = stage_outputs(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text("description: x\nobjective: [{minimize: size_gib}]\n")
    assert run_stage("pipeline.report", model_dir, "--policy", policy).returncode == 0  # whole, it reports
    report = (model_dir / "report.json").read_bytes()
    cut_short(model_dir / output)
    proc = run_stage("pipeline.report", model_dir, "--policy", policy)
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.startswith(f"report: {model_dir / output}: not valid JSON at line ")
        and proc.stderr.count("\n") == 1
    )
    assert proc.stderr.endswith(f"; run `{stage}` again\n")
    assert (model_dir / "report.json").read_bytes() == report  # the last report stays


def test_make_publish_names_a_report_cut_short(tmp_path):
    model_dir = stage_outputs(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text("description: x\nobjective: [{minimize: size_gib}]\n")
    assert run_stage("pipeline.report", model_dir, "--policy", policy).returncode == 0
    cut_short(model_dir / "report.json")
    proc = run_stage("pipeline.publish", "publish", model_dir, "--out", tmp_path / "published")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"publish: {model_dir / 'report.json'}: not valid JSON at line ")
    assert proc.stderr.endswith("; run `make report` again\n")


@pytest.mark.parametrize("output, stage", [("bf16/eval/results.json", "make eval"), ("report.json", "make report")])
def test_make_review_names_a_stage_output_cut_short_before_starting_servers(tmp_path, output, stage):
    model_dir = stage_outputs(tmp_path)
    if output == "report.json":
        policy = tmp_path / "p.yaml"
        policy.write_text("description: x\nobjective: [{minimize: size_gib}]\n")
        assert run_stage("pipeline.report", model_dir, "--policy", policy).returncode == 0
    cut_short(model_dir / output)
    from pipeline.serving import free_port

    proc = run_stage("pipeline.review", model_dir, "--port", free_port())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"review: {model_dir / output}: not valid JSON at line ")
    assert proc.stderr.endswith(f"; run `{stage}` again\n")


def test_bench_table_names_a_bench_json_cut_short(tmp_path):
    model_dir = stage_outputs(tmp_path)
    cut_short(model_dir / "bf16/bench.json")
    proc = run_stage("pipeline.bench", "--table", model_dir)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"error: {model_dir / 'bf16/bench.json'}: not valid JSON at line ")
    assert proc.stderr.endswith("; run `make bench` again\n")


def test_samples_that_are_not_utf8_name_the_file(tmp_path):
    from pipeline.artifacts import read_samples

    path = tmp_path / "samples_x.jsonl"
    path.write_bytes(b'{"doc_id": "\xff"}\n')
    assert one_line_error(read_samples, path).startswith(f"{path}: cannot be read (")


@pytest.mark.parametrize("output", ["bf16/eval/fidelity_fid.npz", "small/eval/fidelity_fid.npz"])
def test_eval_compare_names_a_fidelity_file_cut_short(tmp_path, output):
    import numpy as np

    model_dir = tmp_path / "artifacts/tiny"
    suites = {"fid": {"file": "eval/fidelity-synthetic.yaml", "metric": "fidelity"}}
    for variant in ("bf16", "small"):
        (model_dir / variant / "eval").mkdir(parents=True)
        (model_dir / variant / "eval/results.json").write_text(json.dumps(eval_results("tiny", variant, suites)))
        arrays = {
            "token_ids": np.arange(50),
            "logprob": np.full(50, -0.7),
            "top_ids": np.arange(50)[:, None] + np.arange(4),
            "top_logprobs": np.log(np.tile([0.5, 0.2, 0.1, 0.05], (50, 1))),
        }
        np.savez_compressed(model_dir / variant / "eval/fidelity_fid.npz", **arrays)
    cut_short(model_dir / output)
    proc = run_stage("pipeline.evaluate", "compare", model_dir)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"error: {model_dir / output}: not a whole .npz file (")
    assert proc.stderr.endswith("; run `make eval` again\n")


# ------------------------------------------------------------------------------- repeated members
# A list whose members each count once: SEEDS="0 0" ran a 5-item suite 10 times and reported seeds=2
# (issue 42). A repeat is one line naming the file and key (or the setting) and the value, before any work.
SUITE = "description: x\ngenerator: reading-passages\nnum_items: 3\nprompt: '{question}'\nmetric: squad\n"
PROFILE = "description: x\nshapes: [{name: chat, input_len: 8, output_len: 4}]\nmax_model_len: 64\n"
PROFILE += "max_num_seqs: 1\nmemory_budget_gib: 1\n"


@pytest.mark.parametrize(
    "loader, text, expected",
    [
        ("load_suite", SUITE + "generation: {temperature: 0.6, seeds: [0, 1, 0]}\n", "generation.seeds: 0 is given"),
        ("load_suite", SUITE + "reasoning_generation: {seeds: [2, 2]}\n", "reasoning_generation.seeds: 2 is given"),
        ("load_profile", PROFILE + "concurrency: [1, 4, 4]\n", "concurrency: 4 is given"),
        ("load_profile", PROFILE + "concurrency: [1]\nhf_baseline_concurrency: [1, 1]\n", "hf_baseline_concurrency: 1"),
        (
            "load_profile",
            PROFILE.replace("}]", "}, {name: chat, input_len: 16, output_len: 4}]") + "concurrency: [1]\n",
            "shapes: 'chat' names two shapes",
        ),
        (
            "load_recipe",
            "description: x\nmethod: gptq\nbackend: llmcompressor\nignore: [lm_head, lm_head]\n",
            "ignore: 'lm_head' is given twice",
        ),
        (
            "load_policy",
            "description: x\naccuracy: {max_drop: 0.01, metrics: [gsm8k:exact_match, gsm8k:exact_match]}\n"
            "objective: [{minimize: weights_gib}]\n",
            "accuracy: metrics: 'gsm8k:exact_match' is given",
        ),
        (
            "load_policy",
            "description: x\nobjective: [{minimize: weights_gib}, {maximize: weights_gib}]\n",
            "objective: weights_gib is ranked by twice",
        ),
    ],
    ids=["seeds", "reasoning-seeds", "concurrency", "hf-concurrency", "shape-names", "ignore", "metrics", "objective"],
)
def test_a_list_member_given_twice_is_one_line_naming_the_file_key_and_value(tmp_path, loader, text, expected):
    from pipeline import schema

    path = tmp_path / "x.yaml"
    path.write_text(text)
    message = one_line_error(getattr(schema, loader), path)
    assert message.startswith(f"{path}: ") and expected in message, message


def test_a_capacity_grid_config_naming_a_workload_twice_is_refused(tmp_path):
    from pipeline.schema import load_profile

    path = tmp_path / "p.yaml"
    profile = (ROOT / "bench/cpu-test.yaml").read_text()
    path.write_text(profile.replace("{name: profile}", "{name: profile, workloads: [chat, chat]}"))
    assert "capacity.grid.0.workloads: 'chat' is given twice; give each once" in one_line_error(load_profile, path)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--suites", "eval/synthetic-math.yaml", "--seeds", "0", "0"], "error: SEEDS=0 0: 0 is given twice"),
        (["--suites", "eval/squad.yaml", "eval/squad.yaml"], "error: SUITES: squad is given twice"),
        # two files of one name: their results, samples_<suite>.jsonl and all, would be one suite's
        (["--suites", "eval/squad.yaml", "{tmp}/squad.yaml"], "error: SUITES: squad is given twice (eval/squad.yaml, "),
    ],
)
def test_eval_refuses_a_seed_or_suite_given_twice_before_any_work(tmp_path, args, expected):
    args = [a.format(tmp=tmp_path) for a in args]
    proc = run_stage("pipeline.evaluate", "run", tmp_path / "no-such-variant", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(expected), proc.stderr


def test_bench_refuses_a_variant_given_twice_before_any_server(tmp_path):
    variant = tmp_path / "bf16"
    proc = run_stage("pipeline.bench", variant, tmp_path / "x" / ".." / "bf16", "--profile", "bench/cpu-test.yaml")
    assert proc.returncode == 2 and proc.stderr == "error: BENCH_RECIPES: bf16 is given twice; give each variant once\n"
