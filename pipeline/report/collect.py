"""Everything the stages wrote about each variant of one model; figures of another checkpoint left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifacts import read_bench, read_eval_report, read_eval_run, read_variant_manifest
from pipeline.drift import check_unchanged, eval_inputs, figure_inputs
from pipeline.identity import RERUN, stale_figures, variant_identity
from pipeline.policy import Measured, figures
from pipeline.schema import (
    Accuracy,
    ConfigError,
    EndpointInfo,
    EngineMode,
    EvalReport,
    Fidelity,
    Identity,
    TechniqueStep,
    VariantManifest,
)


@dataclass(kw_only=True)
class Collected(Measured):
    """One variant's files as the report reads them: what the policy reads, and where it came from."""

    dir: str
    manifest: VariantManifest
    identity: Identity
    eval_meta_stale: str | None = None  # eval/results.json left out: the line saying why
    bench_error: str | None = None  # bench.json of a failed bench: its error
    measured_on: dict[str, Identity] = field(default_factory=dict)  # figure source -> what it measured


@dataclass(kw_only=True)
class Collection:
    """What make report reads of one model, eval-report.json once: each variant's files (baseline first),
    the running servers evaluated by URL, and eval's technique steps."""

    variants: dict[str, Collected]
    endpoints: dict[str, CollectedEndpoint]
    techniques: list[TechniqueStep]


def collect(model_dir: Path, baseline: str) -> Collection:
    """Everything the stages wrote about one model."""
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such folder; run `make quantize` first")
    eval_report = read_eval_report(model_dir)
    variants = collect_variants(model_dir, baseline, eval_report)
    return Collection(
        variants=variants,
        endpoints=collect_endpoints(model_dir, variants, baseline, eval_report),
        techniques=eval_report.techniques if eval_report else [],
    )


def collect_variants(model_dir: Path, baseline: str, eval_report: EvalReport | None) -> dict[str, Collected]:
    """Each variant's files, baseline first."""
    dirs = [d for d in sorted(model_dir.iterdir()) if not d.name.startswith(".") and (d / "manifest.json").is_file()]
    if not dirs:
        raise ConfigError(f"{model_dir}: no variants (folders with manifest.json); run `make quantize` first")
    dirs.sort(key=lambda d: d.name != baseline)
    variants = {}
    for d in dirs:
        variants[d.name] = collect_variant(d, baseline, variants, eval_report)
    return variants


def collect_variant(d: Path, baseline: str, variants: dict, eval_report: EvalReport | None) -> Collected:
    """One variant's files; `variants` holds those collected before it (the baseline first)."""
    eval_name = "eval-report.json"
    # per variant: its figures and what they were measured on (a variant eval has not run is absent)
    measured_on = eval_report.identities if eval_report else {}
    manifest = read_variant_manifest(d, verify="hashes")  # the decision rests on the files being these
    identity = variant_identity(manifest)
    bench, bench_error = read_bench(d)
    ev = eval_report.variants.get(d.name) if eval_report else None
    eval_meta = read_eval_run(d)
    # the figures as the files they were made from say now: a recipe, suite or profile edited since refuses
    check_unchanged(figure_inputs(d, manifest, eval_meta, bench))
    # Figures measured on another checkpoint than the one on disk (a rebuild since, an edited manifest)
    # are left out, and the variant cannot qualify: the line says which stage to run again.
    stale, used = {}, {}
    if ev is not None:
        stale["eval"] = stale_figures(eval_name, measured_on.get(d.name), d, identity, RERUN[eval_name].format(d.name))
        if d.name != baseline and baseline in variants and not stale["eval"]:  # its deltas are the baseline's too
            stale["eval"] = stale_figures(
                f"{eval_name} (the deltas against {baseline})",
                measured_on.get(baseline),
                d.parent / baseline,
                variants[baseline].identity,
                RERUN[eval_name].format(baseline),
            )
        if stale["eval"]:
            ev = None
        else:
            used[eval_name] = measured_on[d.name]
    if bench is not None:
        stale["bench"] = stale_figures("bench.json", bench.identity, d, identity, RERUN["bench.json"].format(d.name))
        if stale["bench"]:
            bench = None
        else:
            used["bench.json"] = bench.identity
    eval_meta_stale = eval_meta and stale_figures(
        "eval/results.json", eval_meta.identity, d, identity, RERUN["eval/results.json"].format(d.name)
    )
    return Collected(
        dir=str(d),
        manifest=manifest,
        identity=identity,
        bench=bench,
        eval=ev,
        eval_meta=None if eval_meta_stale else eval_meta,
        eval_meta_stale=eval_meta_stale,
        bench_error=bench_error,
        stale={k: line for k, line in stale.items() if line},
        measured_on=used,
        figures=figures(manifest, bench, ev),
        random_weights=manifest.random_weights,
        bench_device=bench.device if bench else None,
    )


@dataclass(kw_only=True)
class CollectedEndpoint:
    """A running server evaluated by URL (make eval ENDPOINT=...), as the report reads it."""

    info: EndpointInfo  # what it reported of itself
    eval: dict[str, Fidelity | Accuracy] | None  # its eval-report.json figures; None where left out
    stale: str | None  # why they are left out
    engine: EngineMode | None = None  # as its eval/results.json records it: "unknown (endpoint)" and the version


def collect_endpoints(
    model_dir: Path, variants: dict[str, Collected], baseline: str, eval_report: EvalReport | None
) -> dict[str, CollectedEndpoint]:
    """The running servers evaluated by URL: each one's report of itself and its figures in
    eval-report.json, paired with the baseline's. Not variants: no checkpoint, size or bench stands
    behind them, and the policy does not choose among them. Their figures are left out (`stale`) where
    the baseline's are."""
    if eval_report is None:
        return {}
    runs = {name: read_eval_run(model_dir / name) for name in eval_report.endpoints}
    for name, run in runs.items():  # their figures as the suites say now (a variant's: collect_variant)
        if run is not None:
            check_unchanged(eval_inputs(model_dir / name, run))
    base = variants.get(baseline)
    stale = (base.stale.get("eval") if base else None) or (None if base and base.eval else f"{baseline}: not evaluated")
    return {
        name: CollectedEndpoint(
            info=info,
            eval=None if stale else eval_report.variants.get(name),
            stale=stale,
            engine=runs[name].engine if runs[name] else None,
        )
        for name, info in eval_report.endpoints.items()
    }
