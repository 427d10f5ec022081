"""The tables of bench figures (latency, capacity, memory) and of mixed-precision plans; cell formats."""

from __future__ import annotations

from pipeline.figure_names import PERCENTILES, latency_key
from pipeline.policy import Measured


# --------------------------------------------------------------------------------------- markdown
def fmt(value, spec=".3f", missing="—") -> str:
    return missing if value is None else format(value, spec)


def capacity_table(variants: dict[str, Measured]) -> list[str]:
    """Capacity at each workload's SLO under sustained load, for every config of the grid, the chosen one
    in bold, and why it was chosen."""
    sections = {n: v.bench.capacity for n, v in variants.items() if v.bench and v.bench.capacity}
    if not sections:
        return []
    lines = ["## Capacity at an SLO", ""]
    workloads = {w.name: w for c in sections.values() for w in c.workloads}
    for wname, workload in workloads.items():
        lines += [
            f"**{wname}** ({workload.traffic}): {workload.slo_text()}.",
            "",
            "| variant | config | settings | capacity req/s | confirmed | broke at req/s | saturation req/s "
            "| achieved at capacity | points | search s | device |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, section in sections.items():
            choice = section.chosen.get(wname)  # a workload of another variant's section
            for run in (r for r in section.runs if r.workload == wname):
                lines.append(capacity_row(name, variants[name], section, run, choice))
        for name, section in sections.items():
            if choice := section.chosen.get(wname):
                lines.append(f"- {name}: {choice.why}.")
        lines.append("")
    lines += [
        "Capacity: the highest offered Poisson rate at which every target held under sustained load (vLLM's "
        "`vllm bench serve`, EOS ignored): the figures cover the requests after a ramp of a few E2E latencies, "
        "and a point holds only where those requests completed as fast as they arrived (a growing queue is a "
        "break). Confirmed: the rate run again with a longer window and new seeds, the capacity kept only where "
        "it held every time, else a tolerance step lower. Broke at: the lowest rate that did not hold. Bold: the "
        "config chosen, which publish writes into serve.yaml: the reference (the grid's first) unless another "
        "held where the reference broke. Every point is in each variant's bench.json (capacity.runs); the rule "
        "and the grid's settings: docs/bench.md.",
        "",
    ]
    return lines


def capacity_row(name: str, variant: Measured, section, run, choice) -> str:
    config = f"**{run.config}**" if choice and choice.config == run.config else run.config
    settings = ", ".join(f"{k} {v}" for k, v in run.settings.items())
    head = f"| {name}{dagger(variant)} | {config} | {settings} | "
    if run.error:
        return head + f"error: {run.error} |" + " |" * 7
    at = run.repeated_at(run.capacity_rps)
    achieved = f"{at.achieved_rps.min:.3g}-{at.achieved_rps.max:.3g}" if at else "-"
    return head + (
        f"{fmt(run.capacity_rps, '.3g', 'none held')} | {run.spread_text() or 'not run again'} | "
        f"{fmt(run.broke_at_rps, '.3g')} | {fmt(run.saturation_rps, '.3g')} | {achieved} | "
        f"{len(run.points)} | {run.wall_s:.0f} | {section.device_name} |"
    )


def dagger(v: Measured) -> str:
    return " †" if v.random_weights else ""


def latency_tables(variants: dict) -> list[str]:
    benched = {n: v for n, v in variants.items() if v.bench}
    lines = ["## Latency and throughput", ""]
    for name, v in variants.items():
        if "bench" in v.stale:
            lines.append(f"- {name}: left out, {v.stale['bench']}")
        elif not v.bench:
            lines.append(f"- {name}: not benched" + (f" ({v.bench_error})" if v.bench_error else " (no bench.json)"))
    shapes = list(
        dict.fromkeys((lv.shape, lv.input_len, lv.output_len) for v in benched.values() for lv in v.bench.levels)
    )
    for shape, n_in, n_out in shapes:
        lines += [
            "",
            f"### {shape}: {n_in} tokens in, {n_out} out (fixed lengths)",
            "",
            "| variant | device | conc | TTFT ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 | E2E s p50 / p90 / p99 | "
            "output tok/s [min–max] |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in benched.items():
            for lv in v.bench.levels:
                if lv.shape != shape:
                    continue
                s = lv.summary
                trio = lambda metric, scale=1.0, spec=".1f", s=s: " / ".join(
                    format(s[latency_key(metric, p)].median * scale, spec) for p in PERCENTILES
                )
                tp = s["output_throughput"]
                gpus = v.bench.tensor_parallel_size
                device = f"{v.bench_device} x {gpus} (TP)" if gpus > 1 else v.bench_device
                lines.append(
                    f"| {name}{dagger(v)} | {device} | {lv.concurrency} | {trio('ttft')} | "
                    f"{trio('tpot', spec='.2f')} | {trio('e2el', 1e-3, '.3f')} | "
                    f"{tp.median:.1f} [{tp.min:.1f}–{tp.max:.1f}] |"
                )
    if benched:
        lines += [
            "",
            "Each figure is the median over the profile's repeated runs of that run's percentile, from vLLM's "
            "own serving benchmark against its OpenAI server; warm-up excluded.",
            "",
        ]
    return lines


def memory_table(variants: dict) -> list[str]:
    benched = {n: v for n, v in variants.items() if v.bench}
    if not benched:
        return []
    shapes = list(dict.fromkeys(s for v in benched.values() for s in v.bench.memory.max_concurrency_at_budget))
    lines = [
        "## Memory",
        "",
        "| variant | weights GiB | peak activation GiB | CUDA graphs GiB | KV cache GiB | KV tokens | "
        + " | ".join(f"max concurrency at budget, {s}" for s in shapes)
        + " | start-up s | peak RSS GiB |",
        "|" + "---|" * (8 + len(shapes)),
    ]
    for name, v in benched.items():
        m, tp, kv = v.bench.memory, v.bench.tensor_parallel_size, v.bench.kv_cache_dtype
        conc = m.max_concurrency_at_budget
        label = (
            f"{name}{dagger(v)}{f' (TP {tp}: per GPU)' if tp > 1 else ''}{f' (KV cache {kv})' if kv != 'auto' else ''}"
        )
        lines.append(
            f"| {label} | "
            f"{fmt(m.weights_gib)} | "
            f"{fmt(m.peak_activation_gib, '.2f')} | "
            f"{fmt(m.cuda_graph_gib, '.2f')} | {fmt(m.kv_cache_gib, '.2f')} | "
            f"{fmt(m.kv_cache_tokens, ',')} | "
            # a shape of another variant's profile
            + " | ".join(f"{fmt(conc.get(s), ',')} (of {m.budget_gib} GiB)" for s in shapes)
            + f" | {fmt(v.bench.startup_s, '.1f')} | {fmt(m.peak_rss_gib, '.2f')} |"
        )
    lines += [
        "",
        "vLLM's own accounting from its start-up log; on CPU vLLM logs no weights figure and the checkpoint's "
        "size stands in, and the KV cache is the fixed VLLM_CPU_KVCACHE_SPACE.",
        "",
    ]
    return lines


def mixed_precision_tables(variants: dict) -> list[str]:
    """The sensitivity table of every mixed-precision variant (its manifest's), most sensitive first."""
    lines = []
    for name, v in variants.items():
        plan = v.manifest.mixed_precision
        if not plan:
            continue
        kept = set(plan.kept)
        lines += [
            f"## Mixed precision: {name}",
            "",
            f"Layers kept at {plan.sensitive_bits} bits: {', '.join(map(str, plan.kept)) or 'none'} "
            f"(estimated size {plan.estimated_size_ratio:.3f}x the all-INT checkpoint, budget "
            f"{plan.size_budget:g}x). Sensitivity: {plan.method}, {plan.samples} calibration samples, "
            f"{plan.tokens} tokens, {plan.seconds} s.",
            "",
            "| layer | KLD alone | weights | kept |",
            "|---|---|---|---|",
        ]
        for row in sorted(plan.table, key=lambda r: -r.kld):
            lines.append(f"| {row.layer} | {row.kld:.5f} | {row.params:,} | {'yes' if row.layer in kept else ''} |")
        lines.append("")
    return lines
