"""bench.json's capacity section (pipeline/bench/capacity/ writes it; report and publish read it): every
sustained point, each config's search and confirm runs, and the config chosen for each workload; with
the sentences readers print from it (slo_text, spread_text) and the run a deployment is sized by."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.figure_names import LATENCY_LABELS, parse_latency_key
from pipeline.schema.output_base import Output, Spread
from pipeline.schema.profiles import Workload


class LengthQuantiles(Output):
    p10: int
    p50: int
    p90: int
    max: int
    mean: float


class WorkloadLengths(Output):
    """The lengths a from_eval workload replayed (bench/capacity/eval_workload.py)."""

    file: str
    items: int
    prompt_tokens: LengthQuantiles
    output_tokens: LengthQuantiles


class MeasuredWorkload(Output):
    """A workload as bench.json records it (schema.Workload's settings, not checked again as an input),
    with the E2E latency its points were sized by and, from eval's samples, the lengths it replayed."""

    name: str
    traffic: Literal["chat", "reasoning"] = "chat"
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float = 0.0
    from_eval: str | None = None
    burstiness: float = 1.0
    slo: dict[str, float]
    lengths: WorkloadLengths | None = None
    e2e_bound_ms: float  # Workload.e2e_bound_ms at its mean output length: the unit of a point's ramp and window

    def as_input(self) -> Workload:
        """The workload as a profile states it (what verify-published replays)."""
        return Workload.model_validate(self.model_dump(exclude={"lengths", "e2e_bound_ms"}, exclude_defaults=True))

    def slo_text(self) -> str:
        """The SLO as a person reads it: p90 TTFT <= 300 ms, p99 E2E <= 4000 ms (512+-50% in, 256 out, ...)."""
        targets = ", ".join(
            f"p{p} {LATENCY_LABELS[metric]} <= {target:g} ms"
            for (p, metric), target in ((parse_latency_key(key), target) for key, target in self.slo.items())
        )
        spread = f"+-{self.range_ratio:.0%}" if self.range_ratio else ""
        arrivals = "Poisson" if self.burstiness == 1 else f"gamma, burstiness {self.burstiness:g}"
        if self.lengths is not None:
            p, o = self.lengths.prompt_tokens, self.lengths.output_tokens
            shapes = (
                f"eval's {self.from_eval} prompts and output lengths, {self.lengths.items} items: in p50 {p.p50} "
                f"[p10-p90 {p.p10}-{p.p90}], out p50 {o.p50} [{o.p10}-{o.p90}, max {o.max}] tokens"
            )
        elif self.from_eval:
            shapes = f"eval's {self.from_eval} prompts and output lengths"
        else:
            shapes = f"{self.input_len}{spread} tokens in, {self.output_len}{spread} out"
        return f"{targets} ({shapes}, {arrivals} arrivals, sustained)"


class CapacityPoint(Output):
    """One sustained run of vLLM's serving benchmark (pipeline/load/steady.py): figures over the requests
    that arrived in its window, after the ramp."""

    kind: Literal["warmup", "saturation", "search", "confirm", "verify"]
    request_rate: float | None  # offered; None: every request sent at once
    burstiness: float
    seed: int
    num_prompts: int
    completed: int
    failed: int
    ramp_s: float  # arrivals in the first ramp_s are the ramp: in no figure below
    window_s: float  # the arrivals after the ramp that the figures cover
    ramp_requests: int
    window_requests: int
    sent_rps: float | None  # the window's arrivals / its length (a Poisson draw around request_rate)
    achieved_rps: float | None  # the requests completed within the window / its length
    # the window's arrivals minus its completions (the growth of the requests in flight), and that growth
    # in standard deviations of arrival noise (steady.backlog_z); None for an all-at-once point
    backlog_growth: int | None = None
    backlog_z: float | None = None
    duration_s: float  # first request sent to last completed
    request_throughput: float  # completed / duration_s (vLLM's figure, the ramp included)
    output_throughput: float
    request_goodput: float | None  # window requests that met every per-request target / window length
    latency_ms: dict[str, float]  # p50_ttft_ms ... p99_e2el_ms over the window's requests
    mean_e2el_ms: float | None
    slo_broken: list[str]  # empty: the SLO held at this point
    wall_s: float
    timeout_s: float
    timed_out: bool = False
    clients: int = 1  # the client processes that sent it (pipeline/load/bench_serve.py)
    client_cpu: float | None = None  # the busiest one's CPU share over its run: near 1, the client was the limit
    start_s: float = 0.0  # seconds its client processes took to start, before its wall_s (bench_serve.CLIENT_START_S)
    # the machine it ran on (bench.json's machine.instance: a GPU's UUID); None: not recorded. A journal
    # resumed on another machine of the same device name keeps each point's own (choice.py compares on one)
    machine: str | None = None

    @property
    def held(self) -> bool:
        return not self.slo_broken


class RepeatedRate(Output):
    """One rate run in the search and again in confirm runs (a longer window, new seeds), summarised."""

    request_rate: float
    runs: int = Field(ge=1)
    held: int = Field(ge=0)  # runs in which every target of the SLO held
    confirm_window_s: float
    achieved_rps: Spread
    request_goodput: Spread | None  # None where no run measured one
    latency_ms: dict[str, Spread]  # each figure the SLO names, over the runs that measured it

    @model_validator(mode="after")
    def _held_of_runs(self):
        if self.held > self.runs:
            raise ValueError(f"held: {self.held} of {self.runs} runs")
        return self


class CapacityRun(Output):
    """One serving config's search for one workload, and its confirm runs."""

    workload: str
    config: str
    settings: dict  # the vLLM flags the server ran with (max-num-seqs, max-num-batched-tokens, ...)
    # the highest rate that held in the search and in every confirm run of it; None: none
    capacity_rps: float | None
    broke_at_rps: float | None  # the lowest rate at which it broke, in the search or a confirm run
    saturation_rps: float | None
    stopped_by: Literal["tolerance", "max_points", "budget_s", "error"]
    points: list[CapacityPoint]
    wall_s: float
    error: str | None = None
    confirmed: list[RepeatedRate] = []  # the search's capacity run again, then the fallback where it broke
    unstable: bool = False  # the search's capacity broke in a confirm run: capacity_rps is the fallback's

    def repeated_at(self, rate: float | None) -> RepeatedRate | None:
        return next((r for r in self.confirmed if r.request_rate == rate), None)

    def spread_text(self) -> str:
        """The confirm runs as a person reads them, e.g. "held over a 60 s window in 2 of 2 runs, achieved
        99-100% of offered"; where the search's capacity broke, how often it held. Empty where nothing ran again."""
        if not self.confirmed:
            return ""
        at = self.repeated_at(self.capacity_rps)
        text = ""
        if at is not None:
            share = f"{at.achieved_rps.min / at.request_rate:.0%}-{at.achieved_rps.max / at.request_rate:.0%}"
            text = (
                f"held over a {at.confirm_window_s:.0f} s window in {at.held} of {at.runs} runs, "
                f"achieved {share} of offered"
            )
        others = [
            f"{r.request_rate:.3g} req/s held in {r.held} of {r.runs} runs"
            for r in self.confirmed
            if r.request_rate != self.capacity_rps
        ]
        if others:
            lead = "the search's capacity did not hold in every run: " if at else "no rate held in every run: "
            text += ("; " if text else "") + lead + ", ".join(others)
        return text


class CapacityConfig(Output):
    name: str
    overrides: dict
    settings: dict
    startup_s: float | None
    error: str | None = None
    workloads: list[str]  # the workloads it was measured on
    why: str | None = None  # the profile's: what it was expected to buy
    not_chosen_because: str | None = None  # set where it may be measured but never shipped


class Choice(Output):
    """The config chosen for one workload and why (bench/capacity/choice.py)."""

    config: str
    reference: str
    why: str


class Capacity(Output):
    """bench.json's capacity section: the grid, every point, and the config chosen for each workload (the
    reference unless another's confirmed capacity held where the reference broke)."""

    workloads: list[MeasuredWorkload]
    search: dict  # the profile's capacity settings (the rule of a point, points, tolerance, confirm)
    grid: list[CapacityConfig]
    runs: list[CapacityRun]
    chosen: dict[str, Choice]  # workload -> the config chosen for it
    device_name: str  # the GPU's name, or the CPU's model
    vllm_version: str | None
    max_model_len: int
    tensor_parallel_size: int = Field(1, ge=1)
    wall_s: float

    def run_of(self, workload: str, config: str) -> CapacityRun | None:
        return next((r for r in self.runs if r.workload == workload and r.config == config), None)

    def sizing_workload(self, reasoning_model: bool) -> str:
        """The workload a deployment is sized by where the policy names none: a reasoning model's first
        `reasoning` workload (its traffic is long outputs), else the first."""
        if reasoning_model:
            for w in self.workloads:
                if w.traffic == "reasoning":
                    return w.name
        return self.workloads[0].name

    def chosen_run(self, workload: str) -> tuple[MeasuredWorkload, CapacityRun] | None:
        """(workload, the chosen config's run); None where that workload was not measured, or its chosen
        config holds no rate."""
        found = next((w for w in self.workloads if w.name == workload), None)
        choice = self.chosen.get(workload)
        run = self.run_of(workload, choice.config) if found and choice else None
        if run is None or run.capacity_rps is None:
            return None
        return found, run
