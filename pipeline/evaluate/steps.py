"""make eval's technique steps: each variant built from another's recipe with techniques added
(pipeline/evaluate/techniques.py: a rotation over plain GPTQ, INT8-kept layers over a rotation, ...) against that
base, figure by figure and paired on the same items, so eval-report.json says what each step bought and
whether it is more than noise, not only where each variant stands against bf16."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import read_variant_manifest
from pipeline.evaluate.per_item import EvalFiles
from pipeline.evaluate.stats import paired_difference
from pipeline.evaluate.techniques import steps
from pipeline.identity import variant_identity
from pipeline.schema import ConfigError, EvalRun, FidelitySuiteRun, StepFigure, TechniqueStep


def figure(mine, theirs) -> StepFigure:
    return StepFigure(base_value=float(theirs.mean()), value=float(mine.mean()), **paired_difference(mine, theirs))


def step_figures(variant: str, base: str, runs: dict[str, EvalRun], files: EvalFiles) -> dict:
    """The figures of the suites both runs scored alike: fidelity per position (KLD to the baseline, top-1
    agreement with it), accuracy per item (the mean over seeds, where both ran the same seeds)."""
    figures = {}
    for suite, record in runs[variant].suites.items():
        theirs_record = runs[base].suites.get(suite)
        if type(theirs_record) is not type(record):
            continue
        if isinstance(record, FidelitySuiteRun):
            mine, theirs = files.positions(variant, suite), files.positions(base, suite)
            figures |= {f"{suite}:{f}": figure(mine[f], theirs[f]) for f in ("kld", "top1")}
        elif record.seeds == theirs_record.seeds:
            mine, theirs = files.scores(variant, suite), files.scores(base, suite)
            figures |= {
                f"{suite}:{m}": figure(mine[m], theirs[m])
                for m in record.metrics
                if m in mine and m in theirs and len(mine[m]) == len(theirs[m])
            }
    return figures


def measured_recipe(variant_dir: Path, run: EvalRun) -> dict | None:
    """The recipe of the checkpoint `run` measured, as its manifest records it; None where the manifest is
    gone, no longer holds to its files, or is a rebuild's since: figures of another checkpoint are paired
    with nothing (make report leaves them out and says which stage to run again)."""
    try:
        manifest = read_variant_manifest(variant_dir)
    except ConfigError:
        return None
    if manifest is None or run.identity is None or variant_identity(manifest) != run.identity:
        return None
    return manifest.recipe.model_dump()


def technique_steps(runs: dict[str, EvalRun], files: EvalFiles) -> list[TechniqueStep]:
    """Every step among the evaluated variants built here (a running endpoint has no recipe)."""
    recipes = {name: measured_recipe(files.model_dir / name, run) for name, run in runs.items() if run.endpoint is None}
    recipes = {name: recipe for name, recipe in recipes.items() if recipe is not None}
    return [
        TechniqueStep(
            variant=s.variant, base=s.base, added=s.added, figures=step_figures(s.variant, s.base, runs, files)
        )
        for s in steps(recipes)
    ]


def step_table(techniques: list[TechniqueStep]) -> list[str]:
    """eval-report.md's rows of the steps: one a figure."""
    if not techniques:
        return []
    lines = [
        "",
        "## Technique steps: each variant against the variant whose recipe lacks only the keys it adds",
        "",
        "| variant | over | adds | figure | base | variant | Δ | Δ 95% CI (paired) | McNemar p | real? |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in techniques:
        added = ", ".join(f"{k}: {v}" for k, v in step.added.items())
        for key, f in step.figures.items():
            p = "" if f.mcnemar is None else format(f.mcnemar["p_value"], ".3g")
            lines.append(
                f"| {step.variant} | {step.base} | {added} | {key} | {f.base_value:.4f} | {f.value:.4f} | "
                f"{f.delta:+.4f} | [{f.delta_ci95[0]:+.4f}, {f.delta_ci95[1]:+.4f}] | {p} | "
                f"{'yes' if f.significant else 'no'} |"
            )
    return lines
