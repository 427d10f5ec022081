"""Every figure says how vLLM ran it (schema.EngineMode): eager (--enforce-eager) or compiled (torch.compile,
with CUDA graphs on a GPU), and its version. One checkpoint's greedy outputs differ between the two (a
published serve.yaml's compiled server gave 9 of 40 GSM8K greedy outputs identical to eval's, 37 of 40 with
--enforce-eager: docs/suites.md), so eval's results.json and bench.json record it, the report shows it next
to the figures, and a running server evaluated by URL, which does not say, is recorded as unknown."""

import dataclasses
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from fake_engine import ArithmeticClient
from test_report import accuracy, fake_model_dir, policy_file

import pipeline.evaluate.write as write
from pipeline.artifacts import read_eval_run
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import plan_suites
from pipeline.evaluate.run import generate_suites, score_and_write
from pipeline.evaluate.write import EngineRun
from pipeline.report.assemble import report
from pipeline.schema import EndpointInfo, EngineMode, EvalServing
from pipeline.settings import ROOT

from stage_files import eval_report, eval_results

SUITE = ROOT / "eval/synthetic-math.yaml"
ENDPOINT = EndpointInfo(
    url="http://127.0.0.1:8000/v1", model="smol", root="/models/smol", max_model_len=2048, served=["smol"],
    vllm_version="0.26.0", checked_at="2026-12-02T00:00:00+00:00",
)  # fmt: skip


def results_engine(tmp_path, embedded_source, eager: bool, endpoint: EndpointInfo | None = None) -> dict:
    """eval/results.json's pipeline.engine as make eval writes it (score_and_write), from a stand-in server
    that vLLM 0.32.0 started with `eager` (or an endpoint's run, where `eager` is what nobody knows)."""
    settings = EvalSettings([SUITE], limit=2, greedy=True, reasoning_flag="no", dtype="bfloat16")
    plan = plan_suites(embedded_source, settings)
    plan = dataclasses.replace(plan, variant=tmp_path / f"tiny/run-{eager}-{endpoint is not None}", endpoint=endpoint)
    serving = EvalServing(command=["--model", "x"], vllm_version="0.32.0", startup_s=1.0)
    engine = EngineRun(args={}, eager=eager, replicas=1, tp=1, load_s=1.0, serving=serving)
    client = ArithmeticClient()
    (plan.variant / "eval").mkdir(parents=True)
    score_and_write(
        client, plan, generate_suites(client, plan, engine), settings, engine, ({}, {}), plan.variant / "eval"
    )
    assert read_eval_run(plan.variant).engine is not None  # typed: schema.EvalRun reads it back
    return json.loads((plan.variant / "eval/results.json").read_text())["pipeline"]["engine"]


def test_results_json_records_the_engine_mode_and_an_endpoints_as_unknown(tmp_path, embedded_source, monkeypatch):
    assert results_engine(tmp_path, embedded_source, eager=True) == {
        "mode": "eager",
        "cuda_graphs": False,
        "vllm_version": "0.32.0",
    }
    monkeypatch.setattr(write, "on_gpu", lambda: True)  # eval's default on a GPU: graphs and torch.compile
    assert results_engine(tmp_path, embedded_source, eager=False) == {
        "mode": "compiled",
        "cuda_graphs": True,
        "vllm_version": "0.32.0",
    }
    # a running server: whatever the engine dict says, its mode is not known here; its version is what it reported
    assert results_engine(tmp_path, embedded_source, eager=False, endpoint=ENDPOINT) == {
        "mode": "unknown (endpoint)",
        "cuda_graphs": None,
        "vllm_version": "0.26.0",
    }


def with_engine(path, engine: EngineMode, pipeline_entry: bool = False) -> None:
    doc = json.loads(path.read_text())
    (doc["pipeline"] if pipeline_entry else doc)["engine"] = engine.model_dump(mode="json")
    path.write_text(json.dumps(doc))


def test_the_report_shows_the_engine_beside_each_variants_figures_and_an_endpoints(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    eager, compiled = EngineMode.of(True, False, "0.32.0"), EngineMode.of(False, True, "0.32.0")
    for name in ("bf16", "int4"):
        with_engine(model_dir / name / "eval/results.json", eager, pipeline_entry=True)
    with_engine(model_dir / "bf16/bench.json", eager)
    with_engine(model_dir / "int4/bench.json", compiled)  # measured on a GPU server, eval's on the CPU
    served = ENDPOINT.model_dump(mode="json")
    scores = {
        "bf16": {"synthetic-rc:f1": accuracy(0.6)},
        "int4": {"synthetic-rc:f1": accuracy(0.57, 0.95)},
        "endpoint-smol": {"synthetic-rc:f1": accuracy(0.54, 0.9)},
    }
    doc = eval_report("tiny", scores, identities={"endpoint-smol": None}) | {"endpoints": {"endpoint-smol": served}}
    (model_dir / "eval-report.json").write_text(json.dumps(doc))
    run = eval_results("tiny", "endpoint-smol", {}, identity=None, endpoint=served, dtype=None, enforce_eager=None)
    run["pipeline"]["engine"] = EngineMode.of(None, False, "0.26.0").model_dump(mode="json")
    (model_dir / "endpoint-smol/eval").mkdir(parents=True)
    (model_dir / "endpoint-smol/eval/results.json").write_text(json.dumps(run))
    report(model_dir, policy_file(tmp_path))

    md = (model_dir / "report.md").read_text()
    summary = md.split("## Summary", 1)[1].split("\n\n")[1].splitlines()
    assert summary[0].startswith("| variant | format / made by") and summary[0].endswith(
        "| vLLM engine (eval / bench) |"
    )
    rows = {line.split(" | ")[0][2:]: line for line in summary[2:]}
    assert rows["bf16"].endswith("| eager, vLLM 0.32.0 |")  # eval and bench alike: once
    assert rows["int4"].endswith(
        "| eval: eager, vLLM 0.32.0; bench: compiled (torch.compile, CUDA graphs), vLLM 0.32.0 |"
    )
    assert "one checkpoint's greedy outputs differ between the two" in md
    endpoints = md.split("## Endpoints: running servers evaluated by URL", 1)[1]
    assert "| endpoint-smol | `smol` at http://127.0.0.1:8000/v1 | unknown (endpoint), vLLM 0.26.0 |" in endpoints
    reported = json.loads((model_dir / "report.json").read_text())["variants"]
    assert reported["int4"]["engine"] == {"eval": eager.model_dump(), "bench": compiled.model_dump()}


def test_bench_json_records_the_profiles_engine_mode(tmp_path, monkeypatch):
    import pipeline.bench.variant as bench_variant
    from pipeline.schema import Bench, VariantManifest, check_data, load_profile

    from stage_files import bench_record, variant_manifest

    manifest = VariantManifest.model_validate(variant_manifest("tiny", "bf16"))
    monkeypatch.setattr(bench_variant, "package_versions", lambda *names: {"vllm": "0.32.0"})
    cpu = load_profile(ROOT / "bench/cpu.yaml")  # enforce_eager: true
    header = bench_variant.result_header(tmp_path / "bf16", manifest, cpu, ROOT / "bench/cpu.yaml")
    assert header["engine"] == {"mode": "eager", "cuda_graphs": False, "vllm_version": "0.32.0"}
    monkeypatch.setattr(bench_variant, "on_gpu", lambda: True)
    gpu = load_profile(ROOT / "bench/h200.yaml")
    assert not gpu.enforce_eager
    header = bench_variant.result_header(tmp_path / "bf16", manifest, gpu, ROOT / "bench/h200.yaml")
    assert header["engine"] == {"mode": "compiled", "cuda_graphs": True, "vllm_version": "0.32.0"}
    bench = check_data(Bench, bench_record("tiny", "bf16", [], {}, engine=header["engine"]), tmp_path / "bench.json")
    assert bench.engine.text() == "compiled (torch.compile, CUDA graphs), vLLM 0.32.0"
