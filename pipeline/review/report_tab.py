"""The Report tab: report.json's decision and verdicts, marked stale where the checkpoint on disk changed since."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import read_eval_run, read_report, read_variant_manifest
from pipeline.identity import RERUN, stale_figures, variant_identity
from pipeline.schema import ConfigError, Identity, Report, SuiteRecovery


def on_disk(folder: Path) -> tuple[Identity | None, str | None]:
    """(the variant_identity of the variant in `folder`, None) or, where its manifest does not hold up
    against its files (sizes only: the page decides nothing), (None, why)."""
    try:
        manifest = read_variant_manifest(folder)
    except ConfigError as e:
        return None, str(e)
    return (None if manifest is None else variant_identity(manifest)), None


def report_staleness(model_dir: Path, report: Report) -> dict[str, list[str]]:
    """Per variant of report.json, why what it says about that variant no longer holds for the variant on
    disk: rebuilt since the report, or figures the report used measured on another checkpoint."""
    out = {}
    for name, reported in report.variants.items():
        folder = model_dir / name
        current, broken = on_disk(folder)
        if broken:
            out[name] = [broken]
        elif current is None:
            out[name] = [f"report.json was made from {name}, but {folder} has no manifest.json: run make report"]
        elif current.checkpoint_sha256 != reported.checkpoint_sha256:
            was, now = (str(h)[:8] for h in (reported.checkpoint_sha256, current.checkpoint_sha256))
            out[name] = [f"report.json was made from {name} {was}…, but {folder} is now {now}…: run make report"]
        elif reported.measured_on is None:
            out[name] = [stale_figures("report.json", None, folder, current, "make report")]
        else:
            lines = [
                stale_figures(source, measured, folder, current, RERUN[source].format(name))
                for source, measured in reported.measured_on.items()
            ]
            if lines := [line for line in lines if line]:
                out[name] = lines
    return out


def eval_staleness(model_dir: Path, name: str) -> str | None:
    """Why the eval/ of variant `name` does not describe the variant on disk, or None where it does."""
    folder = model_dir / name
    current, broken = on_disk(folder)
    run = read_eval_run(folder)
    return broken or stale_figures(
        "eval/results.json", run and run.identity, folder, current, RERUN["eval/results.json"].format(name)
    )


def report_markdown(model_dir: Path) -> tuple[str, list[Path]]:
    """The decision and verdicts of report.json as Markdown, and the PNG plots of make report; a variant
    whose figures in the report are not of the checkpoint on disk is marked stale, with what to run."""
    try:
        report = read_report(model_dir)
    except ConfigError as e:
        return f"**No report to show.** {e}", []
    decision = report.decision
    stale = report_staleness(model_dir, report)
    lines = [f"**Decision** (policy `{report.policy.file}`, {report.created}): {decision.summary}", ""]
    if stale:
        lines += [
            "**Stale**: what this report says about these variants is not about the checkpoints on disk now:",
            "",
            *[f"- {line}" for problems in stale.values() for line in problems],
            "",
        ]
    lines += ["| variant | qualifies | why |", "|---|---|---|"]
    for name, verdict in decision.verdicts.items():
        mark = "**chosen**" if name == decision.chosen else ("yes" if verdict.qualifies else "no")
        mark += " (**stale**)" if name in stale else ""
        lines.append(f"| {name} | {mark} | {verdict.why.replace('|', '/')} |")
    lines += suite_lines(report.suites, report.policy.baseline)
    lines += ["", f"Full report: `{model_dir / 'report.md'}` (and report.html)."]
    return "\n".join(lines), sorted((model_dir / "plots").glob("*.png"))


def suite_lines(suites: list[SuiteRecovery], baseline: str) -> list[str]:
    """report.json's accuracy figures, hardest for the baseline first, with each variant's recovery."""
    if not suites:
        return []
    names = list(dict.fromkeys(name for row in suites for name in row.recovery))
    lines = [
        "",
        f"**Recovery per suite** (variant score / {baseline}'s), hardest for {baseline} first:",
        "",
        f"| figure | {baseline} | " + " | ".join(names) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    for row in suites:
        cells = [  # a variant not evaluated on every figure has no recovery on some
            "—" if row.recovery.get(n) is None else f"{row.scores[n]:.3f} ({row.recovery[n]:.1%})" for n in names
        ]
        lines.append(f"| {row.figure} | {row.baseline_score:.3f} | " + " | ".join(cells) + " |")
    return lines
