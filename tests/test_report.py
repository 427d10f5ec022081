"""make report on stage files made up for the test: its tables, plots, report.json, the policy names it
refuses, the commands it shows, the hardest suite first with recovery, and the cost per request. The
figures are made up (a test of the rules, not a measurement). Runs where matplotlib is: .venv-serve.
"""

import json
import shlex
from pathlib import Path

import pytest
import yaml

pytest.importorskip("matplotlib")

from pipeline.report.assemble import report
from pipeline.report.plots import pareto_front
from pipeline.schema import ConfigError

from report_inputs import tiny_model_dir, write_policy
from stage_files import bench_record, eval_report, eval_results, identity, variant_manifest
from stage_files import capacity_section as capacity_section_of


@pytest.fixture()
def model_dir(tmp_path, tiny_model) -> Path:
    return tiny_model_dir(tmp_path, tiny_model)


def test_pareto_front_keeps_only_undominated_points():
    points = {"a": (1.0, 0.5), "b": (2.0, 0.6), "c": (2.5, 0.55), "d": (1.0, 0.4)}
    assert pareto_front(points) == ["a", "b"]


def test_report_writes_markdown_html_json_and_plots(tmp_path, model_dir):
    decision = report(model_dir, write_policy(tmp_path, max_tpot=100))
    assert decision.chosen == "small"  # slow is smaller but breaks the latency limit
    md = (model_dir / "report.md").read_text()
    assert "0.290 [0.240, 0.340] Δ -1.0 pt, 96.7% of bf16" in md  # recovery beside the delta
    assert "**Publish small" in md and "chat.c8.p90_tpot_ms: 500 > 100" in md
    html = (model_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and 'src="plots/' not in html  # self-contained
    for stem in ("accuracy_vs_latency", "accuracy_vs_memory", "throughput"):
        assert (model_dir / f"plots/{stem}.png").stat().st_size > 1000 and (model_dir / f"plots/{stem}.svg").is_file()
    assert json.loads((model_dir / "report.json").read_text())["decision"]["chosen"] == "small"


def test_the_same_files_make_the_same_plots_byte_for_byte(tmp_path, model_dir):
    """Two reports of the same stage files: their plots are the same bytes (no date, no random SVG ids), so a
    changed plot means changed figures."""
    policy = write_policy(tmp_path, max_tpot=100)
    report(model_dir, policy)
    first = {p.name: p.read_bytes() for p in (model_dir / "plots").iterdir()}
    report(model_dir, policy)
    assert {p.name: p.read_bytes() for p in (model_dir / "plots").iterdir()} == first and len(first) >= 6


def test_the_report_shows_a_mixed_precision_variants_sensitivity_table(tmp_path, model_dir):
    path = model_dir / "small" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["mixed_precision"] = {
        "method": "each layer alone rounded to nearest",
        "samples": 8,
        "tokens": 2048,
        "seconds": 12.5,
        "prefix": "model.layers",
        "size_budget": 1.1,
        "sensitive_bits": 16,
        "estimated_size_ratio": 1.08,
        "kept": [1],
        "table": [{"layer": 0, "kld": 0.001, "params": 1000}, {"layer": 1, "kld": 0.02, "params": 1000}],
    }
    path.write_text(json.dumps(manifest))
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    md = (model_dir / "report.md").read_text()
    assert "## Mixed precision: small" in md and "Layers kept at 16 bits: 1 (estimated size 1.080x" in md
    assert md.index("| 1 | 0.02000 | 1,000 | yes |") < md.index("| 0 | 0.00100 | 1,000 |  |")  # most sensitive first


# ------------------------------------------------------------- policy names, report header, commands
def fake_model_dir(root: Path) -> Path:
    """Variants as the stages leave them, without weights (report reads manifests, bench.json, eval)."""
    model_dir = root / "my out/tiny"  # OUT with a space: the commands shown must quote it
    summary = {
        k: {"median": v, "min": v, "max": v, "n": 1}
        for k, v in {
            **{f"p{p}_{m}_ms": 50.0 for p in (50, 90, 99) for m in ("ttft", "tpot", "itl", "e2el")},
            "output_throughput": 100.0,
        }.items()
    }
    measured_on = {}
    for name, gib in (("bf16", 0.5), ("int4", 0.2)):
        (model_dir / name / "eval").mkdir(parents=True)
        calib = (
            {"file": "calib/gsm8k-train-chat.yaml", "data_dir": "/data/shared", "samples": 8, "tokens": 800}
            | {"token_ids_sha256": "1" * 64}
            if name == "int4"
            else None
        )
        manifest = variant_manifest(
            "tiny",
            name,
            calibration=calib,
            source={"path": "artifacts/sources/tiny", "sha256": "0" * 64, "origin": "test", "random_weights": False},
        )
        (model_dir / name / "manifest.json").write_text(json.dumps(manifest))
        measured_on[name] = identity(manifest)
        (model_dir / name / "bench.json").write_text(
            json.dumps(
                bench_record(
                    "tiny",
                    name,
                    levels=[{"shape": "long", "input_len": 8, "output_len": 8, "concurrency": 4, "summary": summary}],
                    memory={"weights_gib": gib, "max_concurrency_at_budget": {"long": 3}},
                    identity=measured_on[name],
                )
            )
        )
        (model_dir / name / "eval/results.json").write_text(
            json.dumps(
                eval_results(
                    "tiny",
                    name,
                    {
                        "synthetic-rc": {"file": "eval/synthetic-rc.yaml", "metric": "squad"},
                        "custom": {"file": "/suites/custom.yaml", "metric": "exact_match_numeric"},
                    },
                    data_dir="/data/shared",
                    limit=50,
                    dtype="float16",
                    seeds_override=[1, 2],
                    identity=measured_on[name],
                )
            )
        )
    entry = {"mean": 0.3, "ci95": [0.25, 0.35], "delta": 0.0, "delta_ci95": [-0.02, 0.02], "significant": False}
    (model_dir / "eval-report.json").write_text(
        json.dumps(
            eval_report(
                "tiny",
                {n: {"synthetic-rc:f1": entry, "custom:exact_match": entry} for n in ("bf16", "int4")},
                identities=measured_on,
            )
        )
    )
    return model_dir


def policy_file(tmp_path: Path, **changes) -> Path:
    data = {
        "description": "x",
        "baseline": "bf16",
        "accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rc:f1"]},
        "limits": {"weights_gib": {"max": 1.0}},
        "objective": [{"minimize": "weights_gib"}],
    }
    data.update(changes)
    path = tmp_path / "policies/x.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


NOT_WRITTEN = "{key}: {bad!r} is not a figure the stages write; "


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rcc:f1"]}},
            NOT_WRITTEN.format(key="accuracy.metrics", bad="synthetic-rcc:f1") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rc:f2"]}},
            NOT_WRITTEN.format(key="accuracy.metrics", bad="synthetic-rc:f2") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"limits": {"synthetic-rcc:f1": {"min": 0.2}}},
            NOT_WRITTEN.format(key="limits", bad="synthetic-rcc:f1") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"limits": {"lnog.c4.p90_tpot_ms": {"max": 100}}},
            NOT_WRITTEN.format(key="limits", bad="lnog.c4.p90_tpot_ms") + "did you mean 'long.c4.p90_tpot_ms'?",
        ),
        (
            {"objective": [{"maximize": "max_concurrency.chta"}]},
            NOT_WRITTEN.format(key="objective.0.maximize", bad="max_concurrency.chta")
            + "did you mean 'max_concurrency.chat'?",
        ),
        (
            {"objective": [{"minimize": "synthetic-rc.kld"}]},  # synthetic-rc is not a fidelity suite
            NOT_WRITTEN.format(key="objective.0.minimize", bad="synthetic-rc.kld")
            + "did you mean 'fidelity-synthetic-chat.kld'?",
        ),
        (
            {"limits": {"gsm8k:f1": {"min": 0.2}}},
            NOT_WRITTEN.format(key="limits", bad="gsm8k:f1") + "valid names include gsm8k:exact_match",
        ),
        (
            {"baseline": "bf61"},
            "baseline: 'bf61' is not a variant of {model_dir} (it has bf16, int4); did you mean 'bf16'?",
        ),
    ],
)
def test_a_policy_typo_is_refused_before_the_report_is_overwritten(tmp_path, changes, message):
    model_dir = fake_model_dir(tmp_path)
    report(model_dir, policy_file(tmp_path))
    before = {name: (model_dir / name).read_bytes() for name in ("report.json", "report.md", "report.html")}
    bad = policy_file(tmp_path, **changes)
    with pytest.raises(ConfigError) as e:
        report(model_dir, bad)
    assert str(e.value) == f"{bad}: " + message.format(model_dir=model_dir)
    assert {name: (model_dir / name).read_bytes() for name in before} == before


def test_figures_known_from_the_repository_and_from_the_artifacts_are_accepted(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    names = {
        "limits": {
            "custom:exact_match": {"min": 0.1},  # a suite only this model's eval ran
            "long.c4.p50_ttft_ms": {"max": 100},  # a shape only its bench.json has
            "max_concurrency.long": {"min": 1},
            "chat.c32.output_throughput": {"min": 1},  # bench/h200.yaml's shape and level, not run here
            "gsm8k:exact_match": {"min": 0.1},
        },  # eval/gsm8k.yaml, not run here
        "objective": [{"minimize": "fidelity-gsm8k.kld"}, {"minimize": "peak_rss_gib"}],
    }
    decision = report(model_dir, policy_file(tmp_path, **names))
    assert "gsm8k:exact_match: not measured" in decision.verdicts["int4"].why  # a real name, just not measured


def test_report_header_and_commands_say_where_the_run_was(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    report(model_dir, policy_file(tmp_path))
    md = (model_dir / "report.md").read_text()
    assert f"from `{model_dir}/`" in md and "artifacts/tiny" not in md
    out = shlex.quote(str(model_dir.parent))
    assert (
        f"`python -m pipeline.quantize --model artifacts/sources/tiny --recipe recipes/int4.yaml "
        f"--calib calib/gsm8k-train-chat.yaml --data-dir /data/shared --out {out}`"
    ) in md
    assert (
        f"`python -m pipeline.evaluate run {shlex.quote(str(model_dir / 'int4'))} --suites eval/synthetic-rc.yaml "
        "/suites/custom.yaml --data-dir /data/shared --limit 50 --seeds 1 2 --dtype float16`"
    ) in md
    assert f"`python -m pipeline.bench --profile bench/cpu.yaml {shlex.quote(str(model_dir / 'bf16'))}`" in md
    assert "policy `x.yaml`" in md  # outside the repository: its name only
    # quantized over two GPUs (make quantize DP=2): the command and the line say so
    manifest = json.loads((model_dir / "int4/manifest.json").read_text())
    manifest["quantize"].update(device="NVIDIA H200", peak_gpu_bytes=2**30, ranks=2)
    (model_dir / "int4/manifest.json").write_text(json.dumps(manifest))
    report(model_dir, policy_file(tmp_path))
    md = (model_dir / "report.md").read_text()
    assert f"--data-dir /data/shared --out {out} --dp 2`" in md
    assert "on NVIDIA H200 x 2 (llm-compressor's distributed oneshot)" in md and "on cpu;" in md


# ------------------------------------------------------------------- hardest suite first, recovery
def accuracy(mean: float, recovery: float | None = None) -> dict:
    entry = {"mean": mean, "ci95": [mean - 0.05, mean + 0.05]}
    if recovery is None:
        return entry
    return entry | {"delta": 0.0, "delta_ci95": [-0.02, 0.02], "recovery": recovery, "significant": False}


def test_the_hardest_suite_comes_first_with_the_recovery_of_each(tmp_path):
    from pipeline.review.report_tab import report_markdown

    model_dir = fake_model_dir(tmp_path)
    scores = {  # suites read by name: any the eval report holds, in any order
        "bf16": {"synthetic-rc:f1": accuracy(0.6), "aime24:pass@1": accuracy(0.2), "custom:exact_match": accuracy(0.4)},
        "int4": {
            "synthetic-rc:f1": accuracy(0.57, 0.95),
            "aime24:pass@1": accuracy(0.1, 0.5),
            "custom:exact_match": accuracy(0.4, 1.0),
        },
    }
    built = {n: identity(json.loads((model_dir / n / "manifest.json").read_text())) for n in scores}
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report("tiny", scores, identities=built)))
    report(model_dir, policy_file(tmp_path))
    hardest = ["aime24:pass@1", "custom:exact_match", "synthetic-rc:f1"]
    suites = json.loads((model_dir / "report.json").read_text())["suites"]
    assert [s["figure"] for s in suites] == hardest
    assert suites[0] == {
        "figure": "aime24:pass@1",
        "baseline_score": 0.2,
        "scores": {"int4": 0.1},
        "recovery": {"int4": 0.5},
    }
    md = (model_dir / "report.md").read_text()
    summary_head = next(line for line in md.splitlines() if line.startswith("| variant | format / made by"))
    assert [summary_head.index(f"{f} [95% CI]") for f in hardest] == sorted(summary_head.index(f) for f in hardest)
    table = md.split("## Accuracy by suite, hardest for bf16 first", 1)[1]
    assert "| figure | bf16 | int4 (recovery) |" in table
    rows = [line for line in table.splitlines() if line.startswith(("| aime24", "| custom", "| synthetic"))]
    assert rows[0] == "| aime24:pass@1 | 0.200 | 0.100 (50.0%) |" and rows[2].startswith("| synthetic-rc:f1 | 0.600")
    page, _ = report_markdown(model_dir)  # the review page's Report tab
    assert "**Recovery per suite**" in page and "| aime24:pass@1 | 0.200 | 0.100 (50.0%) |" in page


# ------------------------------------------------------------------------------- cost per request
def capacity_section(capacity_rps: float | None) -> dict:
    """bench.json's capacity section with one config and one workload (chat) that held `capacity_rps`."""
    return capacity_section_of({"profile": ({"max-num-seqs": 4}, capacity_rps)}, "Test GPU")


def test_cost_per_request_ranks_variants_at_their_measured_capacity(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    extra = {"bf16": (capacity_section(2.0), 1, "cuda"), "int4": (capacity_section(5.0), 2, "cuda")}
    for name, (section, gpus, device) in extra.items():
        path = model_dir / name / "bench.json"
        bench = json.loads(path.read_text()) | {"capacity": section, "tensor_parallel_size": gpus, "device": device}
        path.write_text(json.dumps(bench))
    report(model_dir, policy_file(tmp_path, gpu_hour_usd=3.6))
    cost = json.loads((model_dir / "report.json").read_text())["cost"]
    # 1,000 requests: bf16 at 2 req/s on 1 GPU is 500 GPU-s; int4 at 5 req/s on 2 GPUs is 400 GPU-s
    assert [(c["variant"], c["rank"], c["device_seconds_per_1k"]) for c in cost] == [("int4", 1, 400), ("bf16", 2, 500)]
    assert cost[0]["usd_per_1k"] == pytest.approx(0.4) and cost[1]["usd_per_1k"] == pytest.approx(0.5)
    md = (model_dir / "report.md").read_text()
    assert "| chat | 1 | int4 | 5 | 2 | 400.0 | 0.4000 |" in md and "at $3.6 per GPU-hour" in md
    assert "chat device-s / 1k requests |" in md  # the summary's column


def test_cost_is_not_priced_off_a_gpu_nor_ranked_where_no_rate_held(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    for name, held in (("bf16", 1.0), ("int4", None)):
        path = model_dir / name / "bench.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"capacity": capacity_section(held)}))
    report(model_dir, policy_file(tmp_path))
    (only,) = json.loads((model_dir / "report.json").read_text())["cost"]
    assert only["variant"] == "bf16" and only["device"] == "cpu" and only["usd_per_1k"] is None
    assert "| chat | 1 | bf16 | 1 | 1 | 1000.0 | — (not a GPU) |" in (model_dir / "report.md").read_text()


def test_a_policy_gpu_price_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="gpu_hour_usd"):
        report(fake_model_dir(tmp_path), policy_file(tmp_path, gpu_hour_usd=0))


def test_an_endpoint_evaluated_by_url_is_listed_beside_the_variants_and_never_chosen(tmp_path):
    """eval-report.json with an endpoint's figures (make eval ENDPOINT=...): the report gives them beside
    bf16's as the summary gives a variant's, says what served them, and the policy judges variants only."""
    model_dir = fake_model_dir(tmp_path)
    served = {
        "url": "http://127.0.0.1:8000/v1",
        "model": "team/tiny-int4",
        "root": "/models/tiny-int4",
        "max_model_len": 4096,
        "served": ["team/tiny-int4"],
        "vllm_version": "0.26.0",
        "checked_at": "2026-12-02T00:00:00+00:00",
    }
    scores = {
        "bf16": {"synthetic-rc:f1": accuracy(0.6)},
        "int4": {"synthetic-rc:f1": accuracy(0.57, 0.95)},
        "endpoint-tiny-int4": {"synthetic-rc:f1": accuracy(0.54, 0.9)},
    }
    doc = eval_report("tiny", scores, identities={"endpoint-tiny-int4": None}) | {
        "endpoints": {"endpoint-tiny-int4": served}
    }
    (model_dir / "eval-report.json").write_text(json.dumps(doc))
    decision = report(model_dir, policy_file(tmp_path))
    assert set(decision.verdicts) == {"bf16", "int4"}
    md = (model_dir / "report.md").read_text()
    section = md.split("## Endpoints: running servers evaluated by URL", 1)[1]
    assert "| endpoint | served model | vLLM engine | synthetic-rc:f1 [95% CI] |" in section
    assert (
        "| endpoint-tiny-int4 | `team/tiny-int4` at http://127.0.0.1:8000/v1 | unknown (endpoint), vLLM 0.26.0 | "
        "0.540 [0.490, 0.590] Δ +0.0 pt, 90.0% of bf16 |" in section
    )
    assert json.loads((model_dir / "report.json").read_text())["endpoints"] == {"endpoint-tiny-int4": served}
