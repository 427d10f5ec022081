"""make report: the files, built in a staging folder and moved into place together."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from pipeline.exits import held
from pipeline.policy import check_policy_names, decide, policy_file_label
from pipeline.report.collect import Collected, CollectedEndpoint, collect
from pipeline.report.cost import cost_per_request
from pipeline.report.html_page import render_html
from pipeline.report.markdown import engine_modes, render_markdown
from pipeline.report.plots import plot
from pipeline.report.suite_recovery import suite_recovery
from pipeline.run_record import git_commit
from pipeline.schema import Decision, Policy, Report, ReportedVariant, ReportPolicy, load_policy
from pipeline.staging import staging_dir, write_json


def report(model_dir: Path, policy_path: Path) -> Decision:
    policy = load_policy(policy_path)
    collection = collect(model_dir, policy.baseline)
    variants, endpoints = collection.variants, collection.endpoints
    # before anything is written: a typo in a figure name would otherwise read as "not measured"
    check_policy_names(policy, policy_path, model_dir, variants)
    decision = decide(policy, variants)
    # Files are built in a staging folder and moved into place together: a reader never sees a
    # report.md from this run beside plots from the last one.
    with staging_dir(model_dir / ".report") as tmp:
        (tmp / "plots").mkdir()
        plots = plot(variants, policy, decision.chosen, tmp / "plots")
        md = render_markdown(model_dir, collection, policy, policy_path, decision, plots)
        (tmp / "report.md").write_text(md)
        (tmp / "report.html").write_text(render_html(md, f"{model_dir.name}: which variant to deploy", tmp))
        report_file = report_json(model_dir, variants, policy, policy_path, decision, endpoints)
        write_json(tmp / "report.json", report_file.model_dump(mode="json", exclude_unset=True))
    with held():  # into place, next to the variants: all of them, a Ctrl-C waiting until they are
        for item in (model_dir / ".report").iterdir():
            dest = model_dir / item.name
            if dest.is_dir():
                shutil.rmtree(dest)
            item.replace(dest)
        (model_dir / ".report").rmdir()
    return decision


def report_json(
    model_dir: Path,
    variants: dict[str, Collected],
    policy: Policy,
    policy_path: Path,
    decision: Decision,
    endpoints: dict[str, CollectedEndpoint] | None = None,
) -> Report:
    """report.json: the policy, its decision, each variant's flat figures (what publish reads), the
    accuracy figures hardest first with each variant's recovery, the cost per request, and what each
    endpoint evaluated by URL reported of itself."""
    return Report(
        model=model_dir.name,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        git_commit=git_commit(),
        policy=ReportPolicy(file=policy_file_label(policy_path), **policy.model_dump()),
        decision=decision,
        variants={
            n: ReportedVariant(
                dir=v.dir,
                checkpoint_sha256=v.identity.checkpoint_sha256,
                measured_on=v.measured_on,
                random_weights=v.random_weights,
                bench_device=v.bench_device,
                figures=v.figures,
                engine=engine_modes(v),
            )
            for n, v in variants.items()
        },
        suites=suite_recovery(variants, policy.baseline),
        cost=cost_per_request(variants, policy.gpu_hour_usd),
        # absent, not empty, where no endpoint was evaluated: report.json as it was without them
        **({"endpoints": {name: e.info for name, e in endpoints.items()}} if endpoints else {}),
    )
