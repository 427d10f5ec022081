"""The config chosen for a workload, and why.

The reference is the grid's first config measured on the workload (a profile puts vLLM's defaults
there). Its search leaves a bracket: it held at its capacity C and broke at B, so its true capacity lies
in [C, B), and a repeat of the same rate can land anywhere in it. Another config displaces it only where
its own confirmed capacity is at least B (it held where the reference broke: the brackets do not overlap)
and more than `tolerance` above C; otherwise the difference is within what one run to the next can
show, and the reference ships. Both must have been measured on one machine (the points that set C, B and
the other's capacity): a journal resumed on a fresh lease mixes machines of one device name, and two H100s
differed by more than a config does (on 2026-12-07 one broke at 20.5 req/s where another held it with a
fifth less TPOT: docs/measurements/2026-12-07-capacity-graphs-h100/). A config that may not ship
(configs.not_chosen_because) is measured and reported, never chosen.
"""

from __future__ import annotations

from pipeline.schema import CapacityConfig, CapacityRun, Choice


def choose(runs: list[CapacityRun], grid: list[CapacityConfig], workload: str, tolerance: float) -> Choice:
    measured = [c for c in grid if workload in c.workloads]
    reference = measured[0].name
    by_config = {r.config: r for r in runs if r.workload == workload}
    ref = by_config.get(reference)
    shippable = {c.name for c in measured if c.not_chosen_because is None and c.name != reference}
    candidates = [r for name, r in by_config.items() if name in shippable and not r.error and r.capacity_rps]
    best = max(candidates, key=lambda r: r.capacity_rps, default=None)
    ref_cap = ref.capacity_rps if ref is not None and not ref.error else None
    if best is None:
        return Choice(config=reference, reference=reference, why=f"{reference}: no other config held a rate")
    if ref_cap is None:
        why = f"{best.config} held {best.capacity_rps:.3g} req/s; the reference {reference} held no rate"
        return Choice(config=best.config, reference=reference, why=why)
    ratio = best.capacity_rps / ref_cap
    bracket = f"[{ref_cap:.3g}, {_fmt(ref.broke_at_rps)})"
    beyond = ref.broke_at_rps is not None and best.capacity_rps >= ref.broke_at_rps
    if beyond and ratio > 1 + tolerance:
        machines = deciding_machines(ref) | deciding_machines(best)
        if len(machines) != 1 or None in machines:
            why = (
                f"{reference} (the reference) ships: {best.config} held {best.capacity_rps:.3g} req/s "
                f"({ratio:.2f}x), but the points that decide it ran on {_machines_text(machines)}: one machine to "
                "the next differs by as much as a config does; measure both on one machine (one make bench)"
            )
            return Choice(config=reference, reference=reference, why=why)
        why = (
            f"{best.config} held {best.capacity_rps:.3g} req/s, {ratio:.2f}x the reference {reference}'s "
            f"{ref_cap:.3g}, above the reference's bracket {bracket}"
        )
        return Choice(config=best.config, reference=reference, why=why)
    why = (
        f"{reference} (the reference) ships: the best other, {best.config}, held {best.capacity_rps:.3g} req/s "
        f"({ratio:.2f}x), not above the reference's bracket {bracket} by more than tolerance {tolerance:g}"
    )
    return Choice(config=reference, reference=reference, why=why)


def deciding_machines(run: CapacityRun) -> set[str | None]:
    """The machines of the points that set a run's capacity (held at it) and its break (broke at it)."""
    return {
        p.machine
        for p in run.points
        if p.kind in ("search", "confirm")
        and ((p.request_rate == run.capacity_rps and p.held) or (p.request_rate == run.broke_at_rps and not p.held))
    }


def _machines_text(machines: set[str | None]) -> str:
    known = sorted(m for m in machines if m is not None)
    parts = [f"{len(known)} machines ({', '.join(known)})"] if len(known) > 1 else [f"machine {m}" for m in known]
    if None in machines:
        parts.append("machines not recorded (points from before bench.json recorded them)")
    return " and ".join(parts) or "no recorded point"


def _fmt(rate: float | None) -> str:
    return "not broken" if rate is None else f"{rate:.3g}"
