"""Cost per request: what 1,000 requests take of a server's GPUs at the variant's measured capacity (the
config bench chose, bench.json's capacity), and what that costs at the policy's price of a GPU-hour."""

from __future__ import annotations

from pipeline.figure_names import capacity_figure
from pipeline.policy import Measured
from pipeline.schema import CostPerRequest


def cost_per_request(variants: dict[str, Measured], gpu_hour_usd: float) -> list[CostPerRequest]:
    """Per capacity workload, the variants that held a rate ranked cheapest first (report.json's `cost`).
    Device-seconds per 1,000 requests = 1,000 x GPUs per server / capacity; USD only where measured on a
    GPU (a CPU's seconds are not priced as a GPU's)."""
    rows = []
    workloads = dict.fromkeys(
        w.name for v in variants.values() if v.bench and v.bench.capacity for w in v.bench.capacity.workloads
    )
    for workload in workloads:
        held = []
        for name, v in variants.items():
            capacity = v.figures.get(capacity_figure(workload, "capacity_rps"))  # a figure not every variant has
            if not capacity:  # not measured, or no rate held: nothing to divide by
                continue
            gpus = v.bench.tensor_parallel_size
            seconds = 1000 * gpus / capacity
            usd = seconds / 3600 * gpu_hour_usd if v.bench_device == "cuda" else None
            held.append((seconds, name, capacity, gpus, v.bench_device, usd))
        held.sort(key=lambda row: row[:2])
        rows += [
            CostPerRequest(
                workload=workload,
                variant=name,
                rank=rank,
                capacity_rps=capacity,
                gpus=gpus,
                device=device,
                device_seconds_per_1k=seconds,
                usd_per_1k=usd,
            )
            for rank, (seconds, name, capacity, gpus, device, usd) in enumerate(held, 1)
        ]
    return rows


def cost_table(rows: list[CostPerRequest], gpu_hour_usd: float) -> list[str]:
    if not rows:
        return []
    lines = [
        "## Cost per request",
        "",
        "| workload | rank | variant | capacity req/s | GPUs | device-s / 1k requests | "
        f"USD / 1k requests at ${gpu_hour_usd:g} per GPU-hour |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        usd = "— (not a GPU)" if row.usd_per_1k is None else f"{row.usd_per_1k:.4f}"
        lines.append(
            f"| {row.workload} | {row.rank} | {row.variant} | {row.capacity_rps:.3g} | {row.gpus} | "
            f"{row.device_seconds_per_1k:.1f} | {usd} |"
        )
    lines += [
        "",
        "At the capacity of the config bench chose for the workload: one server's GPUs (or CPU) busy for "
        "1,000 / capacity seconds per 1,000 requests; the price is the policy's `gpu_hour_usd`. Variants that "
        "held no rate at the SLO are not ranked.",
        "",
    ]
    return lines
