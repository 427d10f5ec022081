"""Files as the stages write them (pipeline/schema/outputs.py, eval_outputs.py), for
the tests of their readers (report, publish, eval's compare) that need chosen figures: every required key
filled with a neutral value, the figures a test is about passed in. Each is checked against the schema
here, so a fake cannot drift from what the real writers produce (their own tests check those).

Figures record what they were measured on (schema.Identity): pass `identity=identity(manifest)` of the
manifest a test wrote; left out, it is that of `variant_manifest(model, variant)` with its defaults."""

import json
from pathlib import Path

from pipeline.checkpoint_files import file_hashes
from pipeline.identity import tree_hash, variant_identity
from pipeline.schema import Bench, EvalReport, EvalRun, Sample, VariantManifest, check_data, load_profile
from pipeline.settings import ROOT

# bench.json records the whole profile it ran (schema.BenchProfile)
CPU_PROFILE = {"file": "bench/cpu.yaml", **load_profile(ROOT / "bench/cpu.yaml").model_dump(mode="json")}


def identity(manifest: dict) -> dict:
    """What figures measured on the variant of this manifest record (identity.variant_identity)."""
    return variant_identity(VariantManifest.model_validate(manifest)).model_dump(mode="json")


def default_identity(model: str, variant: str) -> dict:
    return identity(variant_manifest(model, variant))


def variant_manifest(model: str, variant: str, **fields) -> dict:
    """A manifest.json; its sha256 is the tree hash of `files` (empty: a variant without weights, for
    readers that need none) unless given."""
    manifest = {
        "model": model,
        "variant": variant,
        "random_weights": False,
        "source": {"path": f"artifacts/sources/{model}", "sha256": "0" * 64, "origin": "test", "random_weights": False},
        "recipe": {
            "file": f"recipes/{variant}.yaml",
            "description": "test",
            "method": "bf16",
            "backend": "transformers",
        },
        "format": "unquantized",
        "backend": "transformers",
        "calibration": None,
        "build_key": "test",
        "created": "2026-11-30T00:00:00+00:00",
        "git_commit": None,
        "packages": {},
        "serve_packages": None,
        "quantize": {"wall_s": 1.0, "peak_rss_bytes": 1},
        "smoke": {"text": "ok"},
        "size_bytes": 0,
        "files": {},
    } | fields
    manifest.setdefault("sha256", tree_hash(manifest["files"]))
    check_data(VariantManifest, manifest, Path(f"{variant}/manifest.json"))
    return manifest


def write_manifest(folder: Path, model: str, variant: str, **fields) -> dict:
    """<variant>/manifest.json for the checkpoint files in `folder`, as make quantize lists them: the
    sha256 of each, size_bytes their total on disk."""
    files = file_hashes(folder)
    size = sum((folder / rel).stat().st_size for rel in files)
    manifest = variant_manifest(model, variant, files=files, size_bytes=size, **fields)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def bench_record(model: str, variant: str, levels: list[dict], memory: dict, **fields) -> dict:
    bench = {
        "model": model,
        "variant": variant,
        "random_weights": False,
        "format": "unquantized",
        "backend": "transformers",
        "checkpoint_sha256": None,
        "size_bytes": None,
        "profile": CPU_PROFILE,
        "machine": {},
        "packages": {"vllm": "0.26.0"},  # publish's serving image follows the vLLM a bench recorded
        "git_commit": None,
        "created": "2026-11-30T00:00:00+00:00",
        "device": "cpu",
        "identity": default_identity(model, variant),
        "startup_s": 10.0,
        "levels": [{"num_prompts": 4, "runs": [], **level} for level in levels],
        "memory": {"weights_gib": None, "budget_gib": 4.0, "max_concurrency_at_budget": {}, **memory},
    } | fields
    check_data(Bench, bench, Path(f"{variant}/bench.json"))
    return bench


def eval_report(
    model: str, variants: dict[str, dict[str, dict]], baseline: str = "bf16", identities: dict | None = None
) -> dict:
    """eval-report.json: accuracy entries get the counts a real run has (100 items, 1 seed, none cut off);
    `identities`: {variant: identity} (the defaults where left out)."""
    neutral = {"std_across_seeds": None, "n": 100, "seeds": 1, "truncated": 0, "no_answer": 0}
    report = {
        "model": model,
        "baseline": baseline,
        "variants": {
            name: {figure: (entry if "kld_mean" in entry else neutral | entry) for figure, entry in figures.items()}
            for name, figures in variants.items()
        },
        "identities": {name: default_identity(model, name) for name in variants} | (identities or {}),
    }
    check_data(EvalReport, report, Path("eval-report.json"))
    return report


def suite_record(entry: dict) -> dict:
    """A suite's entry of results.json as eval writes one for its kind (GenerationSuiteRun or
    FidelitySuiteRun): `entry`'s keys, each figure's as given, the rest as one item under seed 0 with
    nothing cut off would have them."""
    n = entry.get("n", 1)
    if entry["metric"] == "fidelity":
        return {"n": n, "positions": n, "perplexity": 1.0, "top_k": 20, "score_s": 0.1} | entry
    figures = {
        m: {"stderr": 0.0, "per_seed": [f["mean"]], "std_across_seeds": 0.0, "mean_completed": f["mean"]} | f
        for m, f in entry.get("metrics", {}).items()
    }
    counts = {"truncated": 0, "truncated_items_any_seed": 0, "no_answer": 0, "no_answer_items_any_seed": 0}
    made = {"seeds": [0], "items_scored": n, "generated_tokens": n, "generate_s": 1.0}
    return {"n": n} | counts | made | entry | {"metrics": figures}


def eval_results(model: str, variant: str, suites: dict[str, dict], **fields) -> dict:
    """<variant>/eval/results.json, reduced to the "pipeline" entry its readers (compare, report) use."""
    run = {
        "variant": variant,
        "model": model,
        "reasoning_model": False,
        "dtype": "bfloat16",
        "limit": None,
        "data_dir": None,
        "git_commit": None,
        "seeds_override": None,
        "greedy": False,
        "reasoning_flag": "auto",
        "checkpoint_sha256": None,
        "identity": default_identity(model, variant),
        "random_weights": False,
        "packages": {"vllm": "0.26.0"},
        "created": "2026-11-30T00:00:00+00:00",
        "load_s": 1.0,
        "enforce_eager": True,
        "engine_in_process": True,
        "max_tokens_cap": None,
        "generate_s": 1.0,
        "generated_tokens": 1,
        "tokens_per_s": 1.0,
        "suites": {name: suite_record(entry) for name, entry in suites.items()},
    } | fields
    check_data(EvalRun, run, Path(f"{variant}/eval/results.json"))
    return {"pipeline": run}


def samples_file(path: Path, records: list[dict]) -> Path:
    """<variant>/eval/samples_<suite>.jsonl: each record is (doc_id, output, exact_match) plus any other
    key; the rest filled as a real run writes them (seed 0, not cut off, an answer marked)."""
    lines = []
    for rec in records:
        full = {
            "seed": 0,
            "prompt": f"question {rec['doc_id']}",
            "prompt_tokens": 3,
            "output_tokens": 5,
            "finish_reason": "stop",
            "truncated": False,
            "no_answer": False,
            "extracted": None,
            "gold": "4",
        } | rec
        check_data(Sample, full, path)
        lines.append(json.dumps(full))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def capacity_point(kind: str, rate: float | None, achieved: float | None, seed: int, window_s: float = 5.0) -> dict:
    """One CapacityPoint that held: 20 requests in its window, p90 TTFT 100 ms."""
    return {
        "kind": kind,
        "request_rate": rate,
        "burstiness": 1.0,
        "seed": seed,
        "num_prompts": 24,
        "completed": 24,
        "failed": 0,
        "ramp_s": 1.0,
        "window_s": window_s,
        "ramp_requests": 4,
        "window_requests": 20,
        "sent_rps": rate,
        "achieved_rps": achieved,
        "duration_s": 6.5,
        "request_throughput": rate or 0.0,
        "output_throughput": 10.0,
        "request_goodput": achieved,
        "latency_ms": {"p90_ttft_ms": 100.0},
        "mean_e2el_ms": 400.0,
        "slo_broken": [],
        "wall_s": 6.5,
        "timeout_s": 40.0,
        "machine": "this-machine",
    }


def capacity_section(configs: dict[str, tuple[dict, float | None]], device: str, repeats: int = 0) -> dict:
    """bench.json's capacity section: workload chat (bench/cpu-test.yaml's) measured under each serving
    config, {name: (vLLM settings, the rate it held)}, one search point a config at that rate; the first
    config is the reference (the levels' server), the others each started a server. repeats: confirm runs
    at that rate with a window twice as long, each achieving 2% less than the last. Chosen as make bench
    chooses (bench/capacity/choice.py)."""
    from pipeline.bench.capacity.choice import choose
    from pipeline.bench.capacity.search import repeated_rate
    from pipeline.schema import CapacityConfig, CapacityPoint, CapacityRun, load_profile
    from pipeline.settings import ROOT

    profile = load_profile(ROOT / "bench/cpu-test.yaml")
    workload = profile.capacity.workloads[0]
    runs, grid = [], []
    for i, (name, (settings, held)) in enumerate(configs.items()):
        points = [capacity_point("search", held, held, 3)] if held else []
        points += [
            capacity_point("confirm", held, held * (1 - 0.02 * (k + 1)), 4 + k, window_s=10.0)
            for k in range(repeats if held else 0)
        ]
        # a RepeatedRate summarises a rate run again: only where confirm runs were made
        confirmed = (
            [repeated_rate(held, [CapacityPoint.model_validate(p) for p in points], list(workload.slo))]
            if repeats and held
            else []
        )
        runs.append(
            {
                "workload": "chat",
                "config": name,
                "settings": settings,
                "capacity_rps": held,
                "broke_at_rps": None if held is None else held * 1.05,
                "saturation_rps": 12.0,
                "stopped_by": "tolerance",
                "points": points,
                "wall_s": 10.0,
                "error": None,
                "confirmed": [r.model_dump(mode="json") for r in confirmed],
                "unstable": False,
            }
        )
        grid.append(
            {
                "name": name,
                "overrides": {},
                "settings": settings,
                "startup_s": None if i == 0 else 10.0,
                "workloads": ["chat"],
            }
        )
    typed_runs = [CapacityRun.model_validate(r) for r in runs]
    typed_grid = [CapacityConfig.model_validate(c) for c in grid]
    tolerance = profile.capacity.tolerance
    return {
        "workloads": [workload.model_dump(mode="json") | {"e2e_bound_ms": workload.e2e_bound_ms(workload.output_len)}],
        "search": profile.capacity.model_dump(mode="json", exclude={"workloads", "grid"}),
        "grid": grid,
        "runs": runs,
        "chosen": {"chat": choose(typed_runs, typed_grid, "chat", tolerance).model_dump(mode="json")},
        "device_name": device,
        "vllm_version": "0.32.0",
        "max_model_len": profile.max_model_len,
        "tensor_parallel_size": 1,
        "wall_s": 30.0,
    }
