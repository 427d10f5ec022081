"""make bench's command line and table: one-line errors for a bad profile and for more GPUs than there
are, errors and random weights marked in the table. No vLLM needed: both environments."""

import pytest

from pipeline.bench.levels import server_command
from pipeline.bench.table import table
from pipeline.schema import Bench, BenchFailure, ConfigError, load_profile
from pipeline.settings import ROOT, serve_python

from stage_files import bench_record

SERVE_PYTHON = serve_python()


def test_profile_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(
        (ROOT / "bench/cpu.yaml")
        .read_text()
        .replace("\nconcurrency: [1, 8]\n", "\nconcurrency: [1, 8]\nconcurency: 2\n")
    )
    with pytest.raises(ConfigError, match=r"p.yaml: concurency: unknown key"):
        load_profile(bad)
    for name in ("cpu", "h200"):
        assert load_profile(ROOT / f"bench/{name}.yaml").shapes


def test_table_marks_errors_and_random_weights():
    text = table(
        [
            BenchFailure(variant="awq", error="server exited with code 1"),
            Bench.model_validate(bench_record("tiny", "bf16", [], {}, random_weights=True)),
        ]
    )
    assert text.startswith("**random weights — not for accuracy**")
    assert "| awq | error: server exited with code 1 |" in text


def test_tensor_parallel_beyond_the_visible_gpus_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from pipeline.bench.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU, whatever this machine has
    assert main(["--profile", str(ROOT / "bench/cpu.yaml"), "--tp", "2", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: TP=2: tensor parallelism needs GPUs, and none is visible; leave TP=1"
    profile = load_profile(ROOT / "bench/cpu.yaml")
    assert profile.tensor_parallel_size == 1 and "--tensor-parallel-size" not in server_command(tmp_path, profile, 1)
    two = profile.model_copy(update={"tensor_parallel_size": 2})
    assert server_command(tmp_path, two, 1)[-4:-2] == ["--tensor-parallel-size", "2"]
    text = table([Bench.model_validate(bench_record("tiny", "int4", [], {}, tensor_parallel_size=2))])
    assert text.count("\n") == 1  # no levels, no rows; the label is checked where there are levels below
    stats = ("p50_ttft_ms", "p50_tpot_ms", "p90_e2el_ms", "output_throughput")
    summary = {k: {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1} for k in stats}
    level = {"shape": "chat", "input_len": 8, "output_len": 8, "concurrency": 1, "summary": summary}
    bench = bench_record("tiny", "int4", [level], {"weights_gib": 4.7}, tensor_parallel_size=2)
    row = table([Bench.model_validate(bench)])
    assert "| int4 (TP 2: memory per GPU) | chat 8/8 | 1 |" in row
    hf = {"shape": "chat", "input_len": 8, "output_len": 8, "batch": 1, "ttft_s": 0.01, "e2e_s": 0.1}
    with_hf = Bench.model_validate(bench | {"hf_baseline": [hf | {"output_throughput": 80.0}]})
    assert "| int4 (HF generate) | chat 8/8 | 1 | 10 | | 0.10 | 80.0 | | | |" in table([with_hf])


def test_a_bench_without_a_capacity_section_leaves_another_profile_s_search_to_resume(tmp_path):
    """A latency profile's bench.json (bench/h200-decode.yaml) written between two leases of a capacity
    search (bench/h200-reasoning-frontend.yaml) is not that search's end: its journal stays for make bench to
    resume from. (A capacity run's bench.json removes it: test_chain checks that.)"""
    from pipeline.bench.capacity.grid import journal_path
    from pipeline.bench.variant import write_result

    variant = tmp_path / "fp8-dynamic"
    variant.mkdir()
    journal_path(variant).parent.mkdir()
    journal_path(variant).write_text('{"identity": {}}\n')
    assert write_result(variant, Bench.model_validate(bench_record("tiny", "fp8-dynamic", [], {})))
    assert journal_path(variant).read_text() == '{"identity": {}}\n'
    assert not write_result(variant, BenchFailure(variant="fp8-dynamic", error="server exited with code 1"))
    assert journal_path(variant).is_file()
