"""The run-to-run spread of a capacity (pipeline/capacity.py): the rate a search found, run again
`confirm_repeats` times (the profile's CapacitySearch), and the capacity kept only where it held every time.

One point of a search is one draw of Poisson arrivals and random prompts: the same rate run again with
another seed gives another p90 and p99. So after a config's search the capacity C it found is run
confirm_repeats more times, with new seeds and the same number of requests as C's search point (kind
"confirm" in the points). The search's point counts as one of the n runs at C; each repeated rate is
summarised (schema RepeatedRate): request throughput, goodput and every SLO figure as min/median/max,
and "held in k of n runs".

What a deployer can trust is a rate that held in every run of it, so:
  - C held in all n runs: the capacity is C.
  - C broke in a repeat: C is not kept. The run is marked `unstable` and the next-lower rate at which the
    search held (if any) is run confirm_repeats more times the same way; if it held in all of its runs it
    is the capacity, otherwise (or where the search held at no lower rate) the capacity is None: no rate
    held in every run. One fallback only, so the confirm runs of a config cost at most
    2 x confirm_repeats points (each stopped after point_timeout_s); they run outside budget_s, which
    bounds the search alone, so a search that spent its budget is still confirmed.
choose() lets a config other than the grid's first (the reference) win only where its search's capacity
held in every confirm run (not unstable).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


def confirm(measure: Callable[[float | None, int, str], dict], repeats: int, found: dict, slo: list[str]) -> dict:
    """Run the capacity of a search (`found`: its CapacityRun so far) again `repeats` times with
    measure(rate, n, "confirm"), appending to its points; slo: the workload's target names. Returns what
    changes in the CapacityRun: capacity_rps, broke_at_rps, confirmed, unstable."""
    if not repeats:
        return {}
    points = found["points"]
    held = sorted({p["request_rate"] for p in points if p["kind"] == "search" and not p["slo_broken"]}, reverse=True)
    if not held:
        return {}
    capacity, confirmed = None, []
    for rate in held[:2]:  # the search's capacity, then one fallback
        first = next(p for p in points if p["kind"] == "search" and p["request_rate"] == rate)
        runs = [first] + [measure(rate, first["num_prompts"], "confirm") for _ in range(repeats)]
        points += runs[1:]
        confirmed.append(repeated_rate(rate, runs, slo))
        if all(not p["slo_broken"] for p in runs):
            capacity = rate
            break
    broke = [r["request_rate"] for r in confirmed if r["held"] < r["runs"]]
    if found["broke_at_rps"] is not None:
        broke.append(found["broke_at_rps"])
    return {
        "capacity_rps": capacity,
        "broke_at_rps": min(broke, default=None),
        "confirmed": confirmed,
        "unstable": capacity != held[0],
    }


def spread(values: list[float]) -> dict | None:
    """schema.Spread of some runs' figure; None where no run measured it."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def repeated_rate(rate: float, runs: list[dict], slo: list[str]) -> dict:
    """schema.RepeatedRate: the runs at one rate summarised."""
    latency = {key: spread([p["latency_ms"][key] for p in runs if key in p["latency_ms"]]) for key in slo}
    return {
        "request_rate": rate,
        "runs": len(runs),
        "held": sum(not p["slo_broken"] for p in runs),
        "request_throughput": spread([p["request_throughput"] for p in runs]),
        "request_goodput": spread([p["request_goodput"] for p in runs if p.get("request_goodput") is not None]),
        "latency_ms": {key: s for key, s in latency.items() if s is not None},
    }


def held_every_run(run: dict) -> bool:
    """Whether a CapacityRun's search capacity held in every confirm run (true where none were run)."""
    return not run.get("unstable", False)


# ------------------------------------------------------------------------ for report and publish
def spread_text(run) -> str:
    """The repeats of a CapacityRun as a person reads them, e.g. "held in 3 of 3 runs; goodput 39.9-41.6
    req/s", and where the search's capacity broke, how often it held. Empty where nothing was run again.
    run: the schema.CapacityRun a reader returns, or the search's own dict of it while bench runs."""
    if not isinstance(run, dict):
        run = run.model_dump()
    confirmed = {r["request_rate"]: r for r in run.get("confirmed") or []}
    if not confirmed:
        return ""

    def held(r: dict) -> str:
        return f"held in {r['held']} of {r['runs']} runs"

    at = confirmed.get(run["capacity_rps"])
    good = (at or {}).get("request_goodput")
    text = (held(at) + (f"; goodput {good['min']:.3g}-{good['max']:.3g} req/s" if good else "")) if at else ""
    others = [f"{rate:.3g} req/s {held(r)}" for rate, r in confirmed.items() if rate != run["capacity_rps"]]
    if others:
        lead = "the search's capacity did not hold in every run: " if at else "no rate held in every run: "
        text += ("; " if text else "") + lead + ", ".join(others)
    return text
