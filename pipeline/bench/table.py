"""The table make bench prints of its results (and of existing bench.json files, with --table)."""

from __future__ import annotations

from pipeline.artifacts import RANDOM_WEIGHTS_BANNER
from pipeline.schema import Bench, BenchFailure


# ------------------------------------------------------------------------------------- table
def table(results: list[Bench | BenchFailure]) -> str:
    rows = [
        "| variant | shape | conc | p50 TTFT ms | p50 TPOT ms | p90 E2E s | out tok/s | weights GiB | KV tokens | "
        "start s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if isinstance(r, BenchFailure):
            rows.append(f"| {r.variant} | error: {r.error} |||||||||")
            continue
        m, tp = r.memory, r.tensor_parallel_size
        name = f"{r.variant} (TP {tp}: memory per GPU)" if tp > 1 else r.variant
        for lv in r.levels:
            s = lv.summary
            rows.append(
                f"| {name} | {lv.shape} {lv.input_len}/{lv.output_len} | {lv.concurrency} | "
                f"{s['p50_ttft_ms'].median:.0f} | {s['p50_tpot_ms'].median:.1f} | "
                f"{s['p90_e2el_ms'].median / 1000:.2f} | {s['output_throughput'].median:.1f} | "
                f"{_fmt(m.weights_gib)} | {_fmt(m.kv_cache_tokens, ',')} | {r.startup_s} |"
            )
        for h in r.hf_baseline or []:  # HF generate's own records
            rows.append(
                f"| {r['variant']} (HF generate) | {h['shape']} {h['input_len']}/{h['output_len']} | {h['batch']} | "
                f"{h['ttft_s'] * 1000:.0f} | | {h['e2e_s']:.2f} | {h['output_throughput']:.1f} | | | |"
            )
    banner = any(isinstance(r, Bench) and r.random_weights for r in results)
    return ("**" + RANDOM_WEIGHTS_BANNER + "**\n\n" if banner else "") + "\n".join(rows)


def _fmt(v, spec=".2f"):
    return "" if v is None else format(v, spec)
