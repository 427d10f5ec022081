"""report.md's "what each technique buys": each variant built from another's recipe with techniques added
(eval-report.json's technique steps, pipeline/evaluate/techniques.py) against that base: the paired differences eval
measured, the checkpoint's size, and decode latency where bench ran both on the same shape and concurrency
(an online rotation's cost shows there)."""

from __future__ import annotations

from pipeline.figure_names import latency_key
from pipeline.schema import StepFigure, TechniqueStep


def delta_cell(key: str, f: StepFigure) -> str:
    real = " (real)" if f.significant else ""
    spec = ".4f" if key.endswith(":kld") else ".3f"
    return (
        f"{key} {f.base_value:{spec}} → {f.value:{spec}}, Δ {f.delta:+{spec}} "
        f"[{f.delta_ci95[0]:+{spec}}, {f.delta_ci95[1]:+{spec}}]{real}"
    )


def tpot_cell(variant, base) -> str:
    """p50 TPOT, the variant's against its base's, at each shape and concurrency both were benched at."""
    if not (variant.bench and base.bench) or variant.bench_device != base.bench_device:
        return "—"
    key = latency_key("tpot", 50)
    theirs = {(lv.shape, lv.concurrency): lv.summary[key].median for lv in base.bench.levels}
    cells = [
        f"{lv.shape} c{lv.concurrency}: {theirs[at]:.2f} → {lv.summary[key].median:.2f} ms "
        f"({lv.summary[key].median / theirs[at]:.2f}x)"
        for lv in variant.bench.levels
        if (at := (lv.shape, lv.concurrency)) in theirs and theirs[at] > 0
    ]
    return "; ".join(cells) or "—"


def step_row(step: TechniqueStep, variants: dict) -> str:
    variant, base = variants[step.variant], variants[step.base]
    added = ", ".join(f"{k}: {v}" for k, v in step.added.items())
    fidelity = [delta_cell(k, f) for k, f in step.figures.items() if k.endswith((":kld", ":top1"))]
    accuracy = [delta_cell(k, f) for k, f in step.figures.items() if not k.endswith((":kld", ":top1"))]
    size = variant.manifest.size_bytes / base.manifest.size_bytes
    return (
        f"| {step.variant} | {step.base} | {added} | {'<br>'.join(fidelity) or '—'} | "
        f"{'<br>'.join(accuracy) or '—'} | {size:.3f}x | {tpot_cell(variant, base)} |"
    )


def technique_lines(techniques: list[TechniqueStep], variants: dict) -> list[str]:
    """The table, one row a step whose two variants' eval figures stand (a stale one leaves its steps out)."""
    shown = [s for s in techniques if all(n in variants and variants[n].eval is not None for n in (s.variant, s.base))]
    if not shown:
        return []
    return [
        "## What each technique buys",
        "",
        "| variant | over | adds | fidelity to the baseline: base → variant, Δ [paired 95% CI] | "
        "accuracy: base → variant, Δ [paired 95% CI] | size | p50 TPOT: base → variant |",
        "|---|---|---|---|---|---|---|",
        *(step_row(s, variants) for s in shown),
        "",
        "Each row is a variant against the built variant whose recipe lacks only the keys it adds (the fewest, "
        "where several do). Δ is variant minus base on the same items (fidelity: the same scored positions); "
        "(real): the paired CI excludes 0 and, for 0/1 scores, McNemar's test agrees at 5%. Size: of the "
        "checkpoints; TPOT: where both were benched on one device.",
        "",
    ]
