"""Figure names: built and parsed in one place (pipeline/figure_names.py), and every name the stages
write for a variant is one a policy may name."""

import pytest

from pipeline.figure_names import (
    FIGURE_NAME,
    LATENCY_KEY,
    LEVEL_STATS,
    LevelFigure,
    capacity_figure,
    latency_key,
    level_figure,
    parse_latency_key,
    parse_level_figure,
)
from pipeline.policy import figures
from pipeline.schema import Bench, EvalReport, VariantManifest

from stage_files import bench_record, capacity_section, eval_report, variant_manifest


@pytest.mark.parametrize("stat", LEVEL_STATS)
def test_a_level_figure_parses_back_to_what_built_it(stat):
    name = level_figure("chat-long", 16, stat)
    assert parse_level_figure(name) == LevelFigure("chat-long", 16, stat)
    assert FIGURE_NAME.fullmatch(name)
    assert parse_level_figure(name).is_latency == (stat != "output_throughput")


@pytest.mark.parametrize(
    "name",
    ["chat.c8.p95_tpot_ms", "chat.8.p90_tpot_ms", "chat.c8.p90_foo_ms", "gsm8k:exact_match", "weights_gib", "chat.c8"],
)
def test_what_is_not_a_level_figure_parses_to_none(name):
    assert parse_level_figure(name) is None


def test_latency_keys_round_trip_and_only_known_percentiles_match():
    assert latency_key("tpot", 90) == "p90_tpot_ms" and parse_latency_key("p90_tpot_ms") == (90, "tpot")
    assert parse_latency_key("p95_tpot_ms") is None and not LATENCY_KEY.fullmatch("p90_tpot")


def test_every_figure_policy_computes_is_a_valid_figure_name():
    summary = {k: {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1} for k in (*LEVEL_STATS, "request_throughput")}
    level = {"shape": "chat", "input_len": 8, "output_len": 8, "concurrency": 8, "summary": summary}
    memory = {"weights_gib": 0.1, "kv_cache_tokens": 10, "max_concurrency_at_budget": {"chat": 3}}
    capacity = capacity_section({"profile": ({}, 2.0)}, "cpu")
    bench = Bench.model_validate(bench_record("tiny", "bf16", [level], memory, capacity=capacity))
    fidelity = {"kld_mean": 0.1, "kld_ci95": [0.0, 0.2], "kld_mass_covered": 1.0, "top1_agreement": 0.9}
    fidelity |= {"top1_ci95": [0.8, 1.0], "perplexity": 9.0, "baseline_perplexity": 9.0, "positions": 10, "top_k": 5}
    evals = {"gsm8k:exact_match": {"mean": 0.5, "ci95": [0.4, 0.6]}, "wiki": fidelity}
    entry = EvalReport.model_validate(eval_report("tiny", {"bf16": evals})).variants["bf16"]
    names = figures(VariantManifest.model_validate(variant_manifest("tiny", "bf16", size_bytes=2**30)), bench, entry)
    assert capacity_figure("chat", "capacity_rps") in names and level_figure("chat", 8, "p99_e2el_ms") in names
    assert "chat.c8.request_throughput" not in names  # kept in bench.json, not a figure a policy names
    assert [n for n in names if not FIGURE_NAME.fullmatch(n)] == []
