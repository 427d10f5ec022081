"""report.md: the decision under the policy, the summary table, the plots and the tables."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.policy import policy_file_label
from pipeline.report.collect import CollectedEndpoint, Collection
from pipeline.report.cost import cost_per_request, cost_table
from pipeline.report.plots import latency_figure
from pipeline.report.provenance import provenance_section
from pipeline.report.steps import technique_lines
from pipeline.report.suite_recovery import baseline_eval_of, hardest_first, suite_recovery, suites_table
from pipeline.report.tables import capacity_table, dagger, fmt, latency_tables, memory_table, mixed_precision_tables
from pipeline.run_record import git_commit
from pipeline.schema import Accuracy, CostPerRequest, Decision, EngineMode, Fidelity, Policy

MIB = 2**20


def render_markdown(
    model_dir: Path, collection: Collection, policy: Policy, policy_path: Path, decision: Decision, plots: list[str]
) -> str:
    variants = collection.variants
    costs = cost_per_request(variants, policy.gpu_hour_usd)
    lines = header_lines(model_dir, variants, policy_path) + decision_lines(variants, policy, decision)
    lines += summary_lines(variants, policy, costs) + endpoint_lines(collection.endpoints, variants, policy.baseline)
    lines += suites_table(suite_recovery(variants, policy.baseline), policy.baseline)
    lines += technique_lines(collection.techniques, variants)
    for name in plots:
        lines += [f"![{name}](plots/{name}.png)", ""]
    lines += latency_tables(variants) + capacity_table(variants) + cost_table(costs, policy.gpu_hour_usd)
    lines += memory_table(variants) + mixed_precision_tables(variants) + provenance_section(variants)
    return "\n".join(lines) + "\n"


def header_lines(model_dir: Path, variants: dict, policy_path: Path) -> list[str]:
    """The title, the random-weights and stale-figures warnings, and what the page was made from."""
    lines = [f"# {model_dir.name}: which variant to deploy", ""]
    if any(v.random_weights for v in variants.values()):
        lines += [
            f"> **{RANDOM_WEIGHTS_BANNER}**: variants marked † come from random-init weights; their latency and "
            "memory are real, their accuracy figures mean nothing.",
            "",
        ]
    left_out = [line for v in variants.values() for line in v.stale.values()]
    if left_out:
        lines += [
            "> **Stale figures, left out**: measured on another checkpoint than the one on disk; these variants "
            "cannot qualify until the stage named is run again.",
            ">",
            *[f"> - {line}" for line in left_out],
            "",
        ]
    return lines + [
        f"Made by `make report` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from `{model_dir}/` "
        f"(commit {git_commit()}), policy `{policy_file_label(policy_path)}`. Every figure below was read from "
        "a file a stage wrote; "
        "where it came from is at the end.",
        "",
    ]


def decision_lines(variants: dict, policy: Policy, decision: Decision) -> list[str]:
    """The decision, the policy's rules in words, and every variant's verdict."""
    lines = ["## Decision", "", f"**{decision.summary}**", "", f"Policy ({policy.description.strip()}):", ""]
    if policy.accuracy:
        which = "every accuracy figure" if policy.accuracy.metrics == "all" else ", ".join(policy.accuracy.metrics)
        lines.append(
            f"- accuracy: on {which}, with 95% confidence at most {policy.accuracy.max_drop * 100:g} points below "
            f"{policy.baseline} (lower end of the paired bootstrap CI of the difference >= "
            f"-{policy.accuracy.max_drop:g})"
        )
    for name, bound in policy.limits.items():
        lines.append(
            f"- {name} {bound.words(policy.baseline)}" + (f" (measured on {policy.device})" if policy.device else "")
        )
    lines.append(
        "- then " + ", then ".join(f"{'minimise' if o.minimize else 'maximise'} {o.figure}" for o in policy.objective)
    )
    lines += ["", "| variant | verdict |", "|---|---|"]
    for name, verdict in decision.verdicts.items():
        mark = "**chosen**: " if name == decision.chosen else ""
        lines.append(f"| {name}{dagger(variants[name])} | {mark}{verdict.why} |")
    return lines


def summary_lines(variants: dict, policy: Policy, costs: list[CostPerRequest]) -> list[str]:
    """One row per variant: format, size, accuracy (hardest suite first), fidelity, memory, the plots'
    latency and, per capacity workload, the device-seconds 1,000 requests take."""
    base = policy.baseline
    baseline_eval = baseline_eval_of(variants, base)
    metrics = hardest_first(baseline_eval)
    fidelity = [s for s, e in (baseline_eval or {}).items() if isinstance(e, Fidelity)]
    lat = latency_figure(policy, variants)
    cost_of = {(row.workload, row.variant): row.device_seconds_per_1k for row in costs}
    workloads = list(dict.fromkeys(row.workload for row in costs))
    head = [
        "variant",
        "format / made by",
        "size MiB",
        *[f"{m} [95% CI]" for m in metrics],
        *[f"{s} KLD / top-1" for s in fidelity],
        "weights GiB",
        "KV tokens",
        *([lat] if lat else []),
        *[f"{w} device-s / 1k requests" for w in workloads],
        "vLLM engine (eval / bench)",
    ]
    lines = ["", "## Summary", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in variants.items():
        # figures, eval entries and costs by name: a variant has those that were measured on it
        m, figs, ev = v.manifest, v.figures, v.eval or {}
        row = [f"{name}{dagger(v)}", f"{m.format} / {m.backend}", fmt(m.size_bytes / MIB, ".1f")]
        row += [accuracy_cell(ev.get(metric), base) for metric in metrics]
        for s in fidelity:
            e = ev.get(s)
            row.append(f"{e.kld_mean:.4f} / {e.top1_agreement:.3f}" if e else "not measured")
        row += [fmt(figs.get("weights_gib")), fmt(figs.get("kv_cache_tokens"), ",", "—")]
        if lat:
            row.append(fmt(figs.get(lat), ".1f"))
        row += [fmt(cost_of.get((w, name)), ".1f") for w in workloads]
        row.append(engine_cell(engine_modes(v)))
        lines.append("| " + " | ".join(row) + " |")
    return (
        lines
        + [""]
        + (
            []
            if not metrics
            else [
                "Δ: difference to " + base + " in points; significant: its paired 95% CI excludes 0 (and McNemar's "
                "exact p < 0.05 for 0/1 scores). KLD: KL(" + base + " ‖ variant) over the top-100 tokens plus a rest "
                "bucket, a lower bound. Full accuracy detail: `eval-report.md`.",
                "",
            ]
        )
        + [ENGINE_NOTE, ""]
    )


ENGINE_NOTE = (
    "vLLM engine: how the server ran the figures of each stage, eager (--enforce-eager) or compiled "
    "(torch.compile, with CUDA graphs on a GPU); one checkpoint's greedy outputs differ between the two, so "
    "a figure holds for its engine (docs/suites.md)."
)


def engine_modes(v) -> dict[str, EngineMode]:
    """How vLLM ran a variant's figures, by source (eval: its native suites' server; bench), where recorded."""
    modes = {"eval": v.eval_meta.engine if v.eval_meta else None, "bench": v.bench.engine if v.bench else None}
    return {source: mode for source, mode in modes.items() if mode is not None}


def engine_cell(modes: dict[str, EngineMode]) -> str:
    """One engine where eval's and bench's are the same, else each by its source; "—": none recorded."""
    texts = {source: mode.text() for source, mode in modes.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{source}: {text}" for source, text in texts.items()) or "—"


def accuracy_cell(entry: Accuracy | None, baseline: str) -> str:
    if entry is None:
        return "not measured"
    cell = f"{entry.mean:.3f} [{entry.ci95[0]:.3f}, {entry.ci95[1]:.3f}]"
    if entry.delta is not None:  # against the baseline (none for the baseline itself)
        cell += f" Δ {entry.delta * 100:+.1f} pt" + (" **(significant)**" if entry.significant else "")
        cell += f", {entry.recovery:.1%} of {baseline}" if entry.recovery is not None else ""
    return cell


def endpoint_lines(endpoints: dict[str, CollectedEndpoint], variants: dict, baseline: str) -> list[str]:
    """The running servers evaluated by URL, their accuracy and fidelity beside the baseline's, as the
    summary gives the variants'; no size, bench or verdict (the policy chooses among variants only)."""
    if not endpoints:
        return []
    baseline_eval = baseline_eval_of(variants, baseline)
    metrics = hardest_first(baseline_eval)
    fidelity = [s for s, e in (baseline_eval or {}).items() if isinstance(e, Fidelity)]
    head = ["endpoint", "served model", "vLLM engine", *[f"{m} [95% CI]" for m in metrics]]
    head += [f"{s} KLD / top-1" for s in fidelity]
    lines = ["## Endpoints: running servers evaluated by URL", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))
    for name, e in endpoints.items():
        info, ev = e.info, e.eval or {}
        engine = e.engine or EngineMode.of(None, False, info.vllm_version)  # a file from before it was recorded
        row = [name, f"`{info.model}` at {info.url}", engine.text()]
        row += [accuracy_cell(ev.get(m), baseline) for m in metrics]
        row += [f"{ev[s].kld_mean:.4f} / {ev[s].top1_agreement:.3f}" if s in ev else "not measured" for s in fidelity]
        lines.append("| " + " | ".join(row) + " |")
    lines += [f"- {name}: left out, {e.stale}" for name, e in endpoints.items() if e.stale]
    return lines + [
        "",
        f"`make eval ENDPOINT=...`: the suites against a server already running, with MODEL's prompts, paired with "
        f"{baseline}'s records item by item. No checkpoint of this pipeline's stands behind these figures: what the "
        "server reported is in its endpoint.json. Its greedy records are eval's of the same checkpoint only where it "
        "runs as eval's server did (on a CPU, eager), and it does not say how it runs: a published serve.yaml's "
        "server on a GPU compiles (torch.compile, CUDA graphs), and its outputs differ (docs/suites.md).",
        "",
    ]
