"""The search for one config and workload, then its confirm runs (the package's docstring says how).
Pure logic over a `measure(plan) -> CapacityPoint`: a real server's (pipeline/load/bench_serve.py), a
journal's replay (journal.py) or a server simulated in virtual time (tests/sim_server.py)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pipeline.load.steady import PointPlan, burst_plan, sustained_plan
from pipeline.schema import CapacityPoint, CapacityRun, CapacitySearch, RepeatedRate, Spread, Workload

Measure = Callable[[PointPlan], CapacityPoint]


@dataclass
class Probe:
    """One config's search on one workload as it goes: how a point is measured, the search's settings, the
    workload and its E2E bound; the points measured so far in order, each with a seed of its own."""

    measure: Measure
    search: CapacitySearch
    workload: Workload
    e2e_bound_ms: float
    points: list[CapacityPoint] = field(default_factory=list)
    seeds: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def burst(self, kind: str, num_prompts: int) -> CapacityPoint:
        return self._run(burst_plan(kind, num_prompts, self.e2e_bound_ms, next(self.seeds)))

    def sustained(self, kind: str, rate: float, window_x: float = 1.0) -> CapacityPoint:
        return self._run(sustained_plan(kind, rate, self.search, self.e2e_bound_ms, next(self.seeds), window_x))

    def _run(self, plan: PointPlan) -> CapacityPoint:
        self.points.append(self.measure(plan))
        return self.points[-1]


def search_capacity(
    measure: Measure, search: CapacitySearch, workload: Workload, e2e_bound_ms: float, config: str, settings: dict
) -> CapacityRun:
    """The config's CapacityRun for `workload`: the search, then its confirm runs."""
    probe = Probe(measure, search, workload, e2e_bound_ms)
    # the saturation burst is also the warm-up: its figures only guess a first rate, and the compilation and
    # allocation spikes of a fresh server's first load are then behind every sustained point
    saturation = probe.burst("saturation", search.saturation_requests)
    ceiling = saturation.request_throughput
    run = {"workload": workload.name, "config": config, "settings": settings, "saturation_rps": ceiling or None}
    if ceiling <= 0:
        error = f"the saturation run completed none of its {saturation.num_prompts} requests"
        none = {"capacity_rps": None, "broke_at_rps": None, "stopped_by": "error", "error": error}
        return CapacityRun(**run, **none, points=probe.points, wall_s=_wall(probe.points))
    held, broke, stopped = _bisect(probe, ceiling, _first_rates(search, config, workload))
    capacity, confirmed, broke_in_confirm = confirm(probe, held)
    broke_at = min([r for r in (broke, broke_in_confirm) if r is not None], default=None)
    return CapacityRun(
        **run,
        capacity_rps=capacity,
        broke_at_rps=broke_at,
        stopped_by=stopped,
        points=probe.points,
        wall_s=_wall(probe.points),
        confirmed=confirmed,
        unstable=capacity != held,
    )


def _first_rates(search: CapacitySearch, config: str, workload: Workload) -> list[float]:
    entry = next((c for c in search.grid if c.name == config), None)
    return list(entry.first_rates.get(workload.name, [])) if entry else []


def _bisect(probe: Probe, ceiling: float, first: list[float]) -> tuple:
    """(highest rate held, lowest broken, what stopped it). The config's first_rates come first, each while no
    point has decided it. Then the saturation run's throughput, a guess, not a bound: a burst of requests at
    once fills the server with prefills that sustained arrivals spread out, so a rate above it may hold (on
    the H200 the reasoning workload's burst gave 13.7 req/s and 18.9 held). Until a rate breaks, the next is
    twice the highest that held; until one holds, half the lowest that broke."""
    search = probe.search
    held: float | None = None
    broke: float | None = None
    stopped = "max_points"
    spent = 0.0
    first = list(first)
    rate = first.pop(0) if first else ceiling
    for _ in range(search.max_points):
        if spent >= search.budget_s:
            stopped = "budget_s"
            break
        point = probe.sustained("search", rate)
        spent += point.wall_s
        if point.held:
            held = rate if held is None else max(held, rate)
        else:
            broke = rate if broke is None else min(broke, rate)
        if held is not None and broke is not None and within(held, broke, search.tolerance):
            stopped = "tolerance"
            break
        rate = 2 * held if broke is None else rate / 2 if held is None else (held + broke) / 2
        while first:
            given = first.pop(0)
            if (held is None or given > held) and (broke is None or given < broke):
                rate = given
                break
    return held, broke, stopped


def confirm(probe: Probe, held: float | None) -> tuple[float | None, list[RepeatedRate], float | None]:
    """Run the search's capacity `held` again confirm_repeats times with confirm_window times its window. Where
    a run breaks, the confirm goes on below it (_next_confirm_rate) until a rate holds in every run and the
    lowest that broke is within tolerance above it, or confirm_rates are spent: a search point's window can
    hold at a rate the longer one breaks (on an H100 vLLM's defaults held 19 req/s over 34 s and broke at 19
    and at 17.3 over 67 s), and one step down need not be enough. (the stated capacity or None, the rates as
    run again, the lowest rate that broke in them)."""
    search = probe.search
    if held is None or not search.confirm_repeats:
        return held, [], None
    confirmed: list[RepeatedRate] = []
    lo: float | None = None  # the highest rate that held in every run of it
    hi: float | None = None  # the lowest rate that broke in a run of it
    rate = held
    for _ in range(search.confirm_rates):
        runs = [p for p in probe.points if p.kind == "search" and p.request_rate == rate]
        runs += [probe.sustained("confirm", rate, search.confirm_window) for _ in range(search.confirm_repeats)]
        confirmed.append(repeated_rate(rate, runs, list(probe.workload.slo)))
        # every next rate lies between lo and hi, so the latest that held is the highest, the latest broken the lowest
        if all(p.held for p in runs):
            lo = rate
        else:
            hi = rate
        if lo is not None and (hi is None or within(lo, hi, search.tolerance)):
            break
        rate = _next_confirm_rate(lo, hi, probe.points, search.tolerance, first_break=len(confirmed) == 1)
    return lo, confirmed, hi


def _next_confirm_rate(lo, hi, points, tolerance, first_break) -> float:
    """The next rate to confirm below `hi`, the lowest that broke: first a tolerance step down (the search's
    window nearly held there); then halfway to the highest rate that held every run (lo), or, where none
    has yet, to the highest search point below hi that held (confirmed as it is once within tolerance)."""
    if lo is not None:
        return (lo + hi) / 2
    if first_break:
        return hi / (1 + tolerance)
    floor = max((p.request_rate for p in points if p.kind == "search" and p.held and p.request_rate < hi), default=None)
    if floor is None:
        return hi / (1 + tolerance) ** 2
    return floor if within(floor, hi, tolerance) else (floor + hi) / 2


def within(lo: float, hi: float, tolerance: float) -> bool:
    """Whether hi is at most a tolerance step above lo (a rate one step below another counts, float error aside)."""
    return hi / lo - 1 <= tolerance + 1e-9


def spread(values: list[float]) -> Spread | None:
    """The runs' figure as median, min and max; None where no run measured it."""
    if not values:
        return None
    return Spread(median=statistics.median(values), min=min(values), max=max(values), n=len(values))


def repeated_rate(rate: float, runs: list[CapacityPoint], slo: list[str]) -> RepeatedRate:
    """The runs at one rate summarised: achieved rate, goodput and each SLO figure over the runs."""
    latency = {key: spread([p.latency_ms[key] for p in runs if key in p.latency_ms]) for key in slo}
    return RepeatedRate(
        request_rate=rate,
        runs=len(runs),
        held=sum(p.held for p in runs),
        confirm_window_s=max(p.window_s for p in runs if p.kind == "confirm"),
        achieved_rps=spread([p.achieved_rps or 0.0 for p in runs]),
        request_goodput=spread([p.request_goodput for p in runs if p.request_goodput is not None]),
        latency_ms={key: s for key, s in latency.items() if s is not None},
    )


def _wall(points: list[CapacityPoint]) -> float:
    return round(sum(p.wall_s for p in points), 1)
