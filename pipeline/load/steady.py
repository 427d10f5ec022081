"""The rule of a sustained load point: how long it runs, which requests it leaves out as the ramp, and
when it holds. Pure arithmetic over the requests as the client saw them, so the capacity search's tests
drive it from a server simulated in virtual time (tests/sim_server.py) and no figure depends on a clock.

A point offers Poisson (or gamma) arrivals at a fixed rate. After an idle or differently loaded server,
the requests in flight take about one E2E latency to reach their steady number, and a batch server's
step time (so TPOT) follows them: the first requests see a lighter server than the rate makes. So, with
E the E2E latency the workload's SLO allows (Workload.e2e_bound_ms, an upper bound on the real one while
the SLO holds):
  - arrivals run for ramp + window seconds: ramp = ramp_e2e x E, window = max(window_min_s,
    window_e2e x E, min_requests / rate) (x confirm_window for a confirm point);
  - every figure covers the requests that arrived in the window (after the ramp), and the requests that
    completed in it: latency percentiles, goodput, and the achieved rate; where the load comes from
    several client processes (each Poisson at rate/k: together Poisson at the rate), the ramp and the
    window count from when all of them were sending (sending_together);
  - it holds where every SLO target holds over those requests, none failed, AND its queue did not grow
    (QueueRule): the achieved rate (the window's completions / its length) is within max_shortfall of the
    sent one (its arrivals / its length; for a point whose rate a capacity states, of the offered one too),
    and the requests in flight at the window's end exceed those at its start by no more than arrival noise
    explains (max_backlog_z standard deviations). A queue that grows is a break even where its percentiles
    still look fine: the server completes fewer requests than arrive. The second test is the sharper one at
    the knee: on an H100 a rate whose queue grew by 187 requests over 71 s (E2E latency rising about 0.1 s a
    second, z 7.7) completed 90.2% of its arrivals, inside a 10% shortfall; the run's other points that
    held measured z 2.0 or less, its other breaks 5.9 or more.
A point is stopped after timeout_s (ramp + window + max(30 s, 4 E)): a queue that does not drain by then is
a break too. An all-at-once point (warm-up, saturation) has no ramp: its figures cover every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.figure_names import LATENCY_METRICS, PERCENTILES, latency_key, parse_latency_key
from pipeline.schema import CapacityPoint, CapacitySearch, Workload


@dataclass(frozen=True)
class PointPlan:
    """One point before it runs: what to send and which part of it to measure."""

    kind: str  # warmup, saturation, search, confirm, verify
    rate: float | None  # None: every request at once
    num_prompts: int
    ramp_s: float
    window_s: float
    timeout_s: float
    seed: int


@dataclass(frozen=True)
class Request:
    """One request as the client saw it; times in seconds, sent_s since the first request was sent."""

    sent_s: float
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    client: int = 0  # which of the point's client processes sent it

    @property
    def done_s(self) -> float:
        return self.sent_s + self.latency_s


def sustained_plan(
    kind: str, rate: float, search: CapacitySearch, e2e_bound_ms: float, seed: int, window_x: float = 1.0
) -> PointPlan:
    """A Poisson point at `rate` sized by the rule above; window_x: the confirm points' longer window."""
    e2e = e2e_bound_ms / 1000
    ramp = search.ramp_e2e * e2e
    window = max(search.window_min_s, search.window_e2e * e2e, search.min_requests / rate) * window_x
    return PointPlan(
        kind=kind,
        rate=rate,
        num_prompts=math.ceil(rate * (ramp + window)),
        ramp_s=round(ramp, 3),
        window_s=round(window, 3),
        timeout_s=round(ramp + window + max(30.0, 4 * e2e), 1),
        seed=seed,
    )


def burst_plan(kind: str, num_prompts: int, e2e_bound_ms: float, seed: int) -> PointPlan:
    """Every request at once (warm-up, saturation): no ramp; stopped after 60 s + 10 E."""
    e2e = e2e_bound_ms / 1000
    return PointPlan(kind, None, num_prompts, 0.0, 0.0, round(60 + 10 * e2e, 1), seed)


# ------------------------------------------------------------------------------------- figures
def latency_figures(requests: list[Request]) -> dict[str, float]:
    """p50/p90/p99 of TTFT, TPOT, ITL and E2E in ms over the successful requests, as vLLM's benchmark
    computes them (numpy's linear percentiles; TPOT per request over its tokens after the first)."""
    ok = [r for r in requests if r.ok]
    values = {
        "ttft": [r.ttft_s for r in ok],
        "tpot": [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [gap for r in ok for gap in r.itl_s],
        "e2el": [r.latency_s for r in ok],
    }
    return {
        latency_key(m, p): float(np.percentile(values[m], p)) * 1000
        for m in LATENCY_METRICS
        for p in PERCENTILES
        if values[m]
    }


def meets_targets(r: Request, workload: Workload) -> bool:
    """Whether one request met every per-request target of the SLO (vLLM's goodput: TTFT, TPOT, E2E)."""
    per_request = {"ttft": r.ttft_s, "e2el": r.latency_s}
    if r.output_tokens > 1:
        per_request["tpot"] = (r.latency_s - r.ttft_s) / (r.output_tokens - 1)
    for key, target in workload.slo.items():
        metric = parse_latency_key(key)[1]
        if metric in per_request and per_request[metric] * 1000 > target:
            return False
    return r.ok


QUEUE_GREW = "the queue grew"  # how every line of QueueRule.broken ends, so that a re-judge can replace them


@dataclass(frozen=True)
class QueueRule:
    """When a sustained point's queue grew (CapacitySearch.max_shortfall and max_backlog_z). A point whose
    rate a capacity states (offered_kinds: the confirm runs, the published capacity's verify run) is also
    held to the rate offered, not only to the rate its Poisson draw sent: "holds 19 req/s" then means the
    server completed at least (1 - max_shortfall) x 19 a second. A search point is judged by what it sent
    alone, so that arrival noise at low rates (6% over a 38 s window at 7 req/s) decides no bracket."""

    max_shortfall: float
    max_backlog_z: float
    offered_kinds: tuple[str, ...] = ("confirm", "verify")

    @classmethod
    def of(cls, search: CapacitySearch) -> QueueRule:
        return cls(search.max_shortfall, search.max_backlog_z)

    def offered(self, kind: str, rate: float | None) -> float | None:
        """The rate a point of this kind is held to besides its sent rate (None: only the sent one)."""
        return rate if kind in self.offered_kinds else None

    def broken(
        self, sent: float, achieved: float, growth: int, z: float | None, offered: float | None = None
    ) -> list[str]:
        """A line for each way the queue grew over the window (empty: it did not); offered: see offered()."""
        broken = []
        if sent and achieved < (1 - self.max_shortfall) * sent:
            broken.append(
                f"achieved {achieved:.3g} of {sent:.3g} req/s sent (-{1 - achieved / sent:.0%}, more than "
                f"max_shortfall {self.max_shortfall:g}): {QUEUE_GREW}"
            )
        elif offered and achieved < (1 - self.max_shortfall) * offered:
            broken.append(
                f"achieved {achieved:.3g} of the {offered:.3g} req/s offered, the rate it would state "
                f"(-{1 - achieved / offered:.0%}, more than max_shortfall {self.max_shortfall:g}): {QUEUE_GREW}"
            )
        if z is not None and z > self.max_backlog_z:
            broken.append(
                f"{growth} more requests in flight at the window's end than at its start (z {z:.1f} > "
                f"max_backlog_z {self.max_backlog_z:g}, beyond arrival noise): {QUEUE_GREW}"
            )
        return broken


def rejudged(point: CapacityPoint, rule: QueueRule) -> CapacityPoint:
    """A finished point held to another queue rule: its SLO lines kept, its queue lines those of `rule`, so a
    changed max_shortfall or max_backlog_z costs no new measurement. The backlog of a point that lacks its
    figures (measured before they were recorded) follows from its sent and achieved rates over its window;
    its z then takes min(mean E2E, window) as the time in flight, which equals summarize's mean of
    min(E2E, window) wherever no request of the window outlasts it (every point that held)."""
    if point.sent_rps is None or point.achieved_rps is None or point.timed_out:
        return point  # all at once, or stopped at its timeout: no queue rule judged it
    growth, z = point.backlog_growth, point.backlog_z
    if growth is None:
        growth = round((point.sent_rps - point.achieved_rps) * point.window_s)
    if z is None and point.mean_e2el_ms:
        service_s = min(point.mean_e2el_ms / 1000, point.window_s)
        z = round(backlog_z(growth, point.sent_rps, service_s, point.burstiness), 2)
    slo = [line for line in point.slo_broken if not line.endswith(QUEUE_GREW)]
    offered = rule.offered(point.kind, point.request_rate)
    broken = slo + rule.broken(point.sent_rps, point.achieved_rps, growth, z, offered)
    return point.model_copy(update={"backlog_growth": growth, "backlog_z": z, "slo_broken": broken})


def backlog_z(growth: int, sent: float, service_s: float, burstiness: float) -> float | None:
    """How many standard deviations of arrival noise the window's backlog growth is. With Poisson arrivals
    at rate r and requests in flight for S seconds (S capped at the window's length T, mean min(S, T)), the
    arrivals in the window minus its completions of a server that keeps up are two independent arrival counts
    over intervals of that length: variance 2 r min(S, T); gamma arrivals of burstiness b scale it by 1/b.
    None where nothing completed to measure S by."""
    variance = 2 * sent * service_s / burstiness
    return growth / math.sqrt(variance) if variance > 0 else None


def slo_broken(workload: Workload, latency: dict[str, float], failed: int, requests: int) -> list[str]:
    """Each target of the workload's SLO a point missed, with its value and by how much, one line each
    (empty: it held)."""
    broken = []
    if failed:
        broken.append(f"{failed} of {requests} requests failed")
    for key, target in workload.slo.items():
        value = latency.get(key)
        if value is None:
            broken.append(f"{key}: not measured")
        elif value > target:
            broken.append(f"{key} {value:.1f} > {target:g} ms (+{value / target - 1:.0%})")
    return broken


def sending_together(requests: list[Request]) -> tuple[float, float]:
    """When every client process of a point was sending: from the last one's first request to the first
    one's last. Each client's arrivals are Poisson at rate/k, so together they are Poisson at the rate
    only there (processes start a second or two apart); one client: its first request to its last."""
    first, last = {}, {}
    for r in requests:
        first[r.client] = min(first.get(r.client, r.sent_s), r.sent_s)
        last[r.client] = max(last.get(r.client, r.sent_s), r.sent_s)
    return max(first.values(), default=0.0), min(last.values(), default=0.0)


def clients_for(plan: PointPlan, output_tokens: float, e2e_bound_ms: float, tokens_per_client_s: float) -> int:
    """How many client processes a point's load needs: one streams at most tokens_per_client_s (a share of
    a core: bench/client_cost.py measures a token's CPU), so that the client is never what is measured.
    A sustained point streams rate x output_tokens a second; a burst, at most its tokens within E."""
    rate = plan.rate if plan.rate is not None else plan.num_prompts / (e2e_bound_ms / 1000)
    return max(1, math.ceil(rate * output_tokens / tokens_per_client_s))


def summarize(
    plan: PointPlan, requests: list[Request], workload: Workload, rule: QueueRule, wall_s: float
) -> CapacityPoint:
    """The CapacityPoint of a finished point: figures over the window's requests, held to the SLO and,
    where it is sustained, to the queue rule."""
    done = [r.done_s for r in requests if r.ok]
    duration = max(done, default=0.0)  # sent_s counts from the first request sent
    if plan.rate is None:
        window, start, end = list(requests), 0.0, duration
    else:
        start, end = sending_together(requests)
        start += plan.ramp_s
        window = [r for r in requests if start <= r.sent_s <= end]
    e2e = [r.latency_s for r in window if r.ok]
    latency = latency_figures(window)
    failed = sum(not r.ok for r in window)
    good = sum(meets_targets(r, workload) for r in window)
    broken = slo_broken(workload, latency, failed, len(window))
    sent = achieved = growth = z = None
    if plan.rate is not None:
        length = max(end - start, 1e-9)
        completions = sum(start <= t <= end for t in done)
        sent, achieved, growth = len(window) / length, completions / length, len(window) - completions
        service = sum(min(s, length) for s in e2e) / len(e2e) if e2e else 0.0
        z = backlog_z(growth, sent, service, workload.burstiness)
        broken += rule.broken(sent, achieved, growth, z, rule.offered(plan.kind, plan.rate))
    completed = sum(r.ok for r in requests)
    return CapacityPoint(
        kind=plan.kind,
        request_rate=plan.rate,
        burstiness=workload.burstiness,
        seed=plan.seed,
        num_prompts=plan.num_prompts,
        completed=completed,
        failed=len(requests) - completed,
        ramp_s=plan.ramp_s,
        window_s=round(end - start, 3),
        ramp_requests=len(requests) - len(window),
        window_requests=len(window),
        sent_rps=sent,
        achieved_rps=achieved,
        backlog_growth=growth,
        backlog_z=None if z is None else round(z, 2),
        duration_s=round(duration, 3),
        request_throughput=completed / duration if duration else 0.0,
        output_throughput=sum(r.output_tokens for r in requests if r.ok) / duration if duration else 0.0,
        request_goodput=good / (end - start) if end > start else None,
        latency_ms=latency,
        mean_e2el_ms=1000 * sum(e2e) / len(e2e) if e2e else None,
        slo_broken=broken,
        wall_s=round(wall_s, 2),
        timeout_s=plan.timeout_s,
    )


def timed_out(plan: PointPlan, workload: Workload, wall_s: float) -> CapacityPoint:
    """The CapacityPoint of a point stopped at its time limit: the queue did not drain, the SLO broken."""
    stopped = f"stopped after {plan.timeout_s:g} s (its timeout): the requests had not all completed"
    update = {"failed": plan.num_prompts, "duration_s": round(wall_s, 3), "window_s": plan.window_s}
    update |= {"sent_rps": None, "achieved_rps": None, "slo_broken": [stopped], "timed_out": True}
    return summarize(plan, [], workload, QueueRule(1.0, math.inf), wall_s).model_copy(update=update)
