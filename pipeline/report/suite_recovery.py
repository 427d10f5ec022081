"""The accuracy figures hardest first (the baseline's lowest score first) and each variant's recovery of
the baseline's score per figure, read from eval-report.json by whatever suites it holds."""

from __future__ import annotations

from pipeline.policy import Measured, accuracy_names
from pipeline.schema import SuiteRecovery


def hardest_first(baseline_eval: dict | None) -> list[str]:
    """The accuracy figures of the baseline's eval entry, its lowest score first (ties: as eval wrote them)."""
    names = accuracy_names(baseline_eval)
    return sorted(names, key=lambda name: baseline_eval[name].mean)


def baseline_eval_of(variants: dict[str, Measured], baseline: str) -> dict | None:
    """The baseline's eval-report.json entry; None where it was not evaluated (or is not a variant)."""
    return variants[baseline].eval if baseline in variants else None


def suite_recovery(variants: dict[str, Measured], baseline: str) -> list[SuiteRecovery]:
    """Per accuracy figure, hardest first: the baseline's score, every other evaluated variant's score
    and its recovery (variant / baseline; None where the baseline scores 0). report.json's `suites`."""
    baseline_eval = baseline_eval_of(variants, baseline)
    rows = []
    for figure in hardest_first(baseline_eval):
        others = {
            name: v.eval[figure].mean
            for name, v in variants.items()
            if name != baseline and v.eval and figure in v.eval
        }
        base = baseline_eval[figure].mean
        rows.append(
            SuiteRecovery(
                figure=figure,
                baseline_score=base,
                scores=others,
                recovery={name: mean / base if base > 0 else None for name, mean in others.items()},
            )
        )
    return rows


def suites_table(rows: list[SuiteRecovery], baseline: str) -> list[str]:
    """The markdown of `suite_recovery`: one row per figure, hardest first, a column per variant."""
    if not rows:
        return []
    names = list(dict.fromkeys(name for row in rows for name in row.scores))
    lines = [
        f"## Accuracy by suite, hardest for {baseline} first",
        "",
        "| figure | " + " | ".join([baseline, *(f"{n} (recovery)" for n in names)]) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    for row in rows:
        cells = [f"{row.baseline_score:.3f}"]
        for name in names:
            if name not in row.scores:
                cells.append("not measured")
                continue
            recovery = row.recovery[name]
            cells.append(f"{row.scores[name]:.3f} ({'—' if recovery is None else format(recovery, '.1%')})")
        lines.append(f"| {row.figure} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Recovery: the variant's score over {baseline}'s (— where {baseline} scores 0). The lower {baseline} "
        "scores on a suite, the harder it is, and the more a quantized variant tends to lose there.",
        "",
    ]
    return lines
