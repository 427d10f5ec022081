"""make eval's report across variants: every variant's eval/ against the baseline's, on the same items
(artifacts/<model>/eval-report.{json,md})."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.artifacts import read_eval_run
from pipeline.drift import check_unchanged, eval_inputs
from pipeline.evaluate.per_item import EvalFiles
from pipeline.evaluate.stats import fidelity_stats, paired_difference
from pipeline.evaluate.steps import step_table, technique_steps
from pipeline.exits import held
from pipeline.schema import (
    Accuracy,
    ConfigError,
    EndpointInfo,
    EvalReport,
    Fidelity,
    FidelitySuiteRun,
    GenerationSuiteRun,
    check_data,
)
from pipeline.staging import write_json, write_text


def against_baseline(entry: Accuracy, mine: np.ndarray, theirs: np.ndarray) -> Accuracy:
    """`entry` with the paired difference of its figure to the baseline's on the same items."""
    # recovery, as model cards give it: the variant's score as a share of the baseline's
    recovery = float(mine.mean() / theirs.mean()) if theirs.mean() > 0 else None
    return entry.model_copy(update=paired_difference(mine, theirs) | {"recovery": recovery})


def accuracy_rows(
    vdir: Path, baseline: str, suite: str, record: GenerationSuiteRun, mine: dict, theirs: dict, base_seeds: list[int]
) -> dict[str, Accuracy]:
    """One generation suite's figures of one variant, keyed "<suite>:<metric>", paired with the baseline's
    (`theirs`, under `base_seeds`) on the same items and seeds."""
    rows = {}
    counts = {"n": record.n, "truncated": record.truncated, "no_answer": record.no_answer}
    for m, s in record.metrics.items():
        entry = Accuracy(
            mean=s.mean, ci95=s.ci95, std_across_seeds=s.std_across_seeds, seeds=len(record.seeds), **counts
        )
        if vdir.name != baseline:
            if len(mine[m]) != len(theirs[m]) or record.seeds != base_seeds:
                raise ConfigError(
                    f"{vdir}/eval: {suite} has {len(mine[m])} items under seeds {record.seeds}, {baseline} has "
                    f"{len(theirs[m])} under {base_seeds}; run both with the same LIMIT and SEEDS"
                )
            entry = against_baseline(entry, mine[m], theirs[m])
        rows[f"{suite}:{m}"] = entry
    if (cons := record.cons_at_k) is not None:  # cons@k beside pass@1: one majority answer per item, paired per item
        entry = Accuracy(mean=cons.mean, ci95=cons.ci95, std_across_seeds=None, seeds=cons.k, **counts)
        if vdir.name != baseline and "cons_at_k" in theirs:
            entry = against_baseline(entry, mine["cons_at_k"], theirs["cons_at_k"])
        rows[f"{suite}:cons_at_k"] = entry
    return rows


def suite_order(baseline_rows: dict[str, Accuracy | Fidelity]) -> list[str]:
    """The generation suites hardest first: ascending by the baseline's mean on each suite's first figure."""
    first: dict[str, float] = {}
    for key, entry in baseline_rows.items():
        if ":" in key:
            first.setdefault(key.split(":")[0], entry.mean)
    return sorted(first, key=lambda suite: first[suite])


def compare(model_dir: Path, baseline: str) -> EvalReport:
    """Every variant's eval/ against the baseline's, on the same items."""
    base_dir = model_dir / baseline / "eval"
    base = read_eval_run(model_dir / baseline)
    if base is None:
        raise ConfigError(f"{base_dir}: no results; run `make eval` with {baseline} in RECIPES first")
    figures, identities, endpoints, runs = {}, {}, {}, {}
    variants = sorted(p.parent.parent for p in model_dir.glob("*/eval/results.json"))
    files = EvalFiles(model_dir, baseline)  # each file read once, here and by the technique steps
    for vdir in [model_dir / baseline] + [v for v in variants if v.name != baseline]:
        name, is_base = vdir.name, vdir.name == baseline
        run = base if is_base else read_eval_run(vdir)
        check_unchanged(eval_inputs(vdir, run))  # a suite edited since: its items are not the others'
        identities[name] = run.identity  # what these figures (and deltas) were measured on
        runs[name] = run
        if run.endpoint is not None:
            endpoints[name] = run.endpoint
        rows = {}
        for suite, record in run.suites.items():
            if suite not in base.suites:
                continue
            if type(record) is not type(base.suites[suite]):
                raise ConfigError(
                    f"{vdir}/eval: {suite} was scored as {record.metric}, {baseline}'s as {base.suites[suite].metric}; "
                    "run make eval on both with the same suite file"
                )
            if isinstance(record, FidelitySuiteRun):
                at = files.positions(name, suite)
                rows[suite] = Fidelity(**fidelity_stats(files.npz(baseline, suite), files.npz(name, suite), at))
                continue
            voted = record.cons_at_k is not None
            theirs = files.scores(baseline, suite) | ({"cons_at_k": files.consensus(baseline, suite)} if voted else {})
            mine = files.scores(name, suite) | ({"cons_at_k": files.consensus(name, suite)} if voted else {})
            rows |= accuracy_rows(vdir, baseline, suite, record, mine, theirs, base.suites[suite].seeds)
        figures[vdir.name] = rows
    report = check_data(  # as report will read it
        EvalReport,
        {
            "model": model_dir.name,
            "baseline": baseline,
            "variants": figures,
            "identities": identities,
            "suite_order": suite_order(figures[baseline]),
            "endpoints": endpoints,
            "techniques": [step.model_dump(mode="json") for step in technique_steps(runs, files)],
        },
        model_dir / "eval-report.json",
    )
    with held():  # both files of this comparison, a Ctrl-C waiting until they are
        write_json(model_dir / "eval-report.json", report.model_dump(mode="json", exclude_unset=True))
        write_text(model_dir / "eval-report.md", markdown_table(report))
    return report


def fidelity_lines(v: str, key: str, e: Fidelity) -> list[str]:
    return [
        f"| {v} | {key}: KLD (top-{e.top_k} lower bound, mass {e.kld_mass_covered:.3f}) | "
        f"{e.kld_mean:.4f} | [{e.kld_ci95[0]:.4f}, {e.kld_ci95[1]:.4f}] | {e.positions} | | | | | | | |",
        f"| {v} | {key}: top-1 agreement | {e.top1_agreement:.4f} | "
        f"[{e.top1_ci95[0]:.4f}, {e.top1_ci95[1]:.4f}] | {e.positions} | | | | | | | |",
        f"| {v} | {key}: perplexity | {e.perplexity:.3f} | | {e.positions} | | | "
        f"{e.perplexity - e.baseline_perplexity:+.3f} | | | | |",
    ]


def accuracy_line(v: str, key: str, e: Accuracy) -> str:
    seeds = (
        f" (majority of {e.seeds} samples)"
        if key.endswith(":cons_at_k")
        else f" (mean of {e.seeds} seeds, std {e.std_across_seeds:.3f})"
        if e.seeds > 1
        else ""
    )
    recovery = "—" if e.recovery is None else f"{e.recovery:.1%}"
    delta = (
        f"{e.delta:+.3f} | {recovery} | [{e.delta_ci95[0]:+.3f}, {e.delta_ci95[1]:+.3f}] | "
        f"{'' if e.mcnemar is None else format(e.mcnemar['p_value'], '.3g')} | "
        f"{'yes' if e.significant else 'no'}"
        if e.delta is not None
        else "— | | | |"
    )
    no_answer = "—" if e.no_answer is None else e.no_answer
    return (
        f"| {v} | {key}{seeds} | {e.mean:.3f} | [{e.ci95[0]:.3f}, {e.ci95[1]:.3f}] | "
        f"{e.n} | {e.truncated} | {no_answer} | {delta} |"
    )


def markdown_table(report: EvalReport) -> str:
    lines = [
        f"# {report.model}: accuracy and fidelity vs {report.baseline}",
        "",
        "| variant | figure | value | 95% CI | n | trunc | no answer | Δ vs baseline | recovery | Δ 95% CI (paired) "
        "| McNemar p | real? |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, rows in report.variants.items():
        for key, e in rows.items():
            lines += fidelity_lines(v, key, e) if isinstance(e, Fidelity) else [accuracy_line(v, key, e)]
    for name, info in report.endpoints.items():
        lines += ["", f"{name}: {endpoint_text(info)}."]
    lines += [
        "",
        "trunc: outputs cut off by max_tokens; no answer: outputs without a final-answer marker (MATH: no "
        "\\boxed{}, scored 0; GSM8K-style: no \\boxed{}/####/'answer is', scored on the last number; SQuAD: "
        "empty), counted over items x seeds.",
    ]
    lines += step_table(report.techniques)
    return "\n".join(lines) + "\n"


def endpoint_text(info: EndpointInfo) -> str:
    """An endpoint's results in words: a running server, not a checkpoint of this pipeline's."""
    return (
        f"a running server evaluated by URL (make eval ENDPOINT=...), not a checkpoint built here: {info.model} "
        f"at {info.url}, vLLM {info.vllm_version or '(version not reported)'}, max_model_len "
        f"{info.max_model_len}, checked {info.checked_at}"
    )
