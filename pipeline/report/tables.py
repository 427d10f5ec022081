"""The tables of bench figures (latency, capacity, memory) and of mixed-precision plans; cell formats."""

from __future__ import annotations

from pipeline.capacity import slo_text
from pipeline.capacity_spread import spread_text
from pipeline.figure_names import PERCENTILES, latency_key
from pipeline.policy import Measured


# --------------------------------------------------------------------------------------- markdown
def fmt(value, spec=".3f", missing="—") -> str:
    return missing if value is None else format(value, spec)


def capacity_table(variants: dict[str, Measured]) -> list[str]:
    """Capacity at each workload's SLO, for every config of the grid, the chosen one in bold."""
    sections = {n: v.bench.capacity for n, v in variants.items() if v.bench and v.bench.capacity}
    if not sections:
        return []
    lines = ["## Capacity at an SLO", ""]
    workloads = {w.name: w for c in sections.values() for w in c.workloads}
    for wname, workload in workloads.items():
        lines += [
            f"**{wname}**: {slo_text(workload)}.",
            "",
            "| variant | config | settings | capacity req/s | repeats | broke at req/s | saturation req/s "
            "| goodput at capacity | runs | search s | device |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, section in sections.items():
            for run in (r for r in section.runs if r.workload == wname):
                chosen = section.chosen.get(wname) == run.config  # a workload of another variant's section
                at = next((p for p in run.points if p.request_rate == run.capacity_rps), None)
                config = f"**{run.config}**" if chosen else run.config
                settings = ", ".join(f"{k} {v}" for k, v in run.settings.items())
                lines.append(
                    f"| {name}{dagger(variants[name])} | {config} | {settings} | "
                    + (
                        f"error: {run.error} |||||||"
                        if run.error
                        else f"{fmt(run.capacity_rps, '.3g', 'none held')} | {spread_text(run) or 'one run'} | "
                        f"{fmt(run.broke_at_rps, '.3g')} | "
                        f"{fmt(run.saturation_rps, '.3g')} | {fmt(at and at.request_goodput, '.3g')} | "
                        f"{len(run.points)} | {run.wall_s:.0f} | {section.device_name} |"
                    )
                )
        lines.append("")
    lines += [
        "Capacity: the highest Poisson rate measured at which every target held (vLLM's `vllm bench serve`, "
        "random prompts, EOS ignored); repeats: the capacity run again with new seeds (the profile's "
        "confirm_repeats; the search's point is one of the runs), the capacity kept only where it held in every "
        "run, else the next-lower rate that did; broke at: the lowest at which one did not; bold: the config "
        "chosen (the grid's first unless another, whose capacity held in every run, holds more by more than the "
        "search tolerance), which publish writes into serve.yaml. Every point is in each variant's bench.json "
        "(capacity.runs).",
        "",
    ]
    return lines


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
