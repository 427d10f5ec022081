"""What a bench profile (bench/*.yaml) may say: shapes, concurrency, and the capacity search at an SLO."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from pipeline.figure_names import LATENCY_KEY
from pipeline.schema.common import EACH_ONCE, Strict, _validate, repeated


class Shape(Strict):
    name: str
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=0)


class Profile(Strict):
    """What to measure and how hard (bench/*.yaml): data, like recipes."""

    description: str
    shapes: list[Shape] = Field(min_length=1)
    concurrency: Annotated[list[int], EACH_ONCE] = Field(min_length=1)
    prompts_per_level: int = Field(2, ge=1, description="requests per run = max(min_prompts, this x concurrency)")
    min_prompts: int = Field(4, ge=1)
    repeats: int = Field(3, ge=1)
    warmups: int = Field(1, ge=0)
    # auto on CPU: bf16 where it has bf16 instructions, else float32 (serving.cpu_dtype)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    enforce_eager: bool = False
    # GPU: the largest decode batch captured in a CUDA graph. Unset: the project's rule (serving.cuda_graph_settings:
    # up to max_num_seqs); 512 is vLLM's own default, so a capacity profile whose reference is vLLM's defaults
    # measures them on the latency levels' server instead of starting another
    max_cudagraph_capture_size: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # GPU: the slice vLLM may take
    # GPUs one server spans (vLLM's --tensor-parallel-size): for a model one GPU cannot hold, or to see what
    # a second GPU buys in latency; `make bench TP=2` overrides it
    tensor_parallel_size: int = Field(1, ge=1)
    cpu_kv_cache_gib: int = Field(2, gt=0)  # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    memory_budget_gib: float = Field(gt=0, description="the budget for the max-concurrency figure")
    startup_timeout_s: int = Field(600, gt=0)
    hf_baseline_concurrency: Annotated[list[int], EACH_ONCE] = []
    hf_baseline_repeats: int = Field(1, ge=1)
    capacity: CapacitySearch | None = None  # requests per second at an SLO, and the serving config that holds most

    @model_validator(mode="after")
    def _shape_names(self):
        # a shape's name keys its figures (chat.c8.p90_tpot_ms): two of one name would measure into one
        if twice := repeated(s.name for s in self.shapes):
            raise ValueError(f"shapes: {twice[0]!r} names two shapes; give each its own name")
        return self


# ---------------------------------------------------------------- capacity at an SLO (bench profiles)
# pipeline/bench/capacity/ searches, per variant and serving config, the highest Poisson request rate at
# which every target of a workload's SLO holds under sustained load (pipeline/load/steady.py: the rule of a
# point); the grid's best config is what publish writes into serve.yaml.
SLO_KEY = LATENCY_KEY


class Workload(Strict):
    """Requests of one kind and what they must meet: random prompts of input_len +/- range_ratio tokens,
    output_len +/- range_ratio tokens generated (vLLM's random dataset, uniform in that range, EOS
    ignored), or (from_eval: a suite) the prompts eval sent the variant and as many output tokens as it
    wrote to each, from its eval/samples_<suite>.jsonl; arriving as a Poisson process (burstiness 1) or a
    gamma one (below 1: burstier). traffic: what it stands for; a reasoning model's deployment is sized by
    its first `reasoning` workload (long outputs), any other model's by the first workload."""

    name: str = Field(pattern=r"^[\w-]+$")
    traffic: Literal["chat", "reasoning"] = "chat"
    input_len: int | None = Field(None, gt=0)
    output_len: int | None = Field(None, gt=1)  # TPOT needs a second token
    range_ratio: float = Field(0.0, ge=0, lt=1)
    from_eval: str | None = Field(None, pattern=r"^[\w.-]+$")
    burstiness: float = Field(1.0, gt=0)
    # the targets, by the names bench.json's latency figures use: p90_ttft_ms, p90_tpot_ms, p99_e2el_ms, ...
    slo: dict[str, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _slo_names(self):
        if self.from_eval is None and (self.input_len is None or self.output_len is None):
            raise ValueError("give input_len and output_len (random prompts), or from_eval: SUITE (eval's own)")
        if self.from_eval is not None:
            for key in sorted({"input_len", "output_len", "range_ratio"} & self.model_fields_set):
                raise ValueError(f"{key}: from_eval takes the lengths from eval's samples; remove it")
        for key, target in self.slo.items():
            if not SLO_KEY.fullmatch(key):
                raise ValueError(
                    f"slo: {key!r} is not a latency percentile; use p50/p90/p99 + ttft/tpot/itl/e2el, e.g. p90_ttft_ms"
                )
            if target <= 0:
                raise ValueError(f"slo: {key} must be above 0 ms (got {target:g})")
        if not any(k.endswith(("_ttft_ms", "_e2el_ms")) for k in self.slo):
            # queueing past the knee shows in TTFT and E2E only; TPOT stays flat while requests wait
            raise ValueError(
                "slo: needs a ttft or e2el target (an overloaded server queues, which TPOT and ITL do not show)"
            )
        if self.e2e_bound_ms(2) is None:
            # a sustained point's length is a multiple of the E2E latency the SLO allows (pipeline/load/steady.py)
            raise ValueError("slo: bound the E2E latency: an e2el target, or a ttft target with a tpot or itl one")
        return self

    def e2e_bound_ms(self, mean_output_tokens: float) -> float | None:
        """The longest E2E latency the SLO allows a request of mean_output_tokens: its tightest e2el target,
        else TTFT + (tokens - 1) x TPOT (or ITL) at their targets; None where it bounds none."""
        e2e = [t for k, t in self.slo.items() if k.endswith("_e2el_ms")]
        if e2e:
            return min(e2e)
        ttft = [t for k, t in self.slo.items() if k.endswith("_ttft_ms")]
        step = [t for k, t in self.slo.items() if k.endswith(("_tpot_ms", "_itl_ms"))]
        if not ttft or not step:
            return None
        return min(ttft) + max(0.0, mean_output_tokens - 1) * min(step)


class ServingConfig(Strict):
    """One point of the grid: vLLM server settings; unset ones are the profile's (max_num_seqs,
    gpu_memory_utilization, max_cudagraph_capture_size) or vLLM's own default; a config that sets none runs
    on the latency levels' server.
    kv_cache_dtype other than the variant recipe's is measured but never chosen: eval measured the
    recipe's (a recipe with kv_cache_dtype fp8 ships it). workloads: the workloads it is measured on
    (unset: all); why: what it is expected to buy, for the report."""

    name: str = Field(pattern=r"^[\w-]+$")
    max_num_seqs: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_cudagraph_capture_size: int | None = Field(None, gt=0)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_dtype: Literal["auto", "fp8"] | None = None
    # vLLM's API server processes (tokenizing, detokenizing, streaming): one is a single Python process
    api_server_count: int | None = Field(None, gt=0)
    # tokens a streamed response's events carry at most (the first is sent alone): fewer events, less
    # detokenizing and SSE work in the API server a token
    stream_interval: int | None = Field(None, gt=0)
    workloads: Annotated[list[str], EACH_ONCE] | None = Field(None, min_length=1)
    why: str | None = None
    # workload -> rates its search tries first, in order, before its own rule (an earlier run's bracket: a
    # search from the saturation guess spends most of a lease above or below the knee). Each is measured
    # here and decides as any point does; one already decided by an earlier point is skipped.
    first_rates: dict[str, Annotated[list[PositiveFloat], Field(min_length=1)]] = {}

    def overrides(self) -> dict:
        """The vLLM settings it sets, by their engine-argument names."""
        skip = {"name", "workloads", "why", "first_rates"}
        return {k: v for k, v in self.model_dump().items() if k not in skip and v is not None}

    def measures(self, workload: str) -> bool:
        return self.workloads is None or workload in self.workloads


class CapacitySearch(Strict):
    """How the capacity of each config is found (pipeline/bench/capacity/). Per config and workload: a
    saturation run (saturation_requests at once: its throughput S, a first guess, and the server's warm-up;
    a search resumed on a fresh server warms it with warmup_requests at once first), then at most max_points
    sustained Poisson points: a config's first_rates, then S, doubled while it holds and none broke,
    halved while the SLO breaks and none held, then bisection between the highest rate that held and the
    lowest that broke, until they are within `tolerance`; no
    point starts once the search's points have taken budget_s. A sustained point (pipeline/load/steady.py)
    sends arrivals for ramp + window seconds, with E the E2E latency the SLO allows (Workload.e2e_bound_ms):
    ramp = ramp_e2e x E (its requests excluded from every figure), window = max(window_min_s,
    window_e2e x E, min_requests / rate); it holds where every SLO target holds over the window's requests
    AND its queue did not grow: the rate they completed at is within max_shortfall of the rate they arrived
    at, and the requests in flight grew over the window by at most max_backlog_z standard deviations of
    arrival noise (pipeline/load/steady.py: QueueRule); a confirm run's achieved rate is also within
    max_shortfall of the rate offered, the rate it states. Then the capacity
    found runs again confirm_repeats times with a window confirm_window times as long (new seeds); where a
    run breaks, lower rates are confirmed the same way, at most confirm_rates in all: the stated capacity is
    a rate that held in every run of it."""

    workloads: list[Workload] = Field(min_length=1)
    # the first measured for a workload is its reference: another wins only above the reference's bracket
    grid: list[ServingConfig] = Field(min_length=1)
    warmup_requests: int = Field(ge=1)
    saturation_requests: int = Field(ge=2)
    ramp_e2e: float = Field(2.0, ge=0.5, le=10)
    window_e2e: float = Field(3.0, ge=1, le=50)
    window_min_s: float = Field(30.0, gt=0)
    min_requests: int = Field(ge=4)
    max_shortfall: float = Field(0.1, gt=0, lt=1)
    # a one-sided test. The noise model (steady.backlog_z) is a little narrow for a batching server: on the
    # simulated one (tests/sim_server.py) keeping up at 47-85% of its knee, z over 60 seeds has a standard
    # deviation of 1.2-1.3, so 4 is about 3.1 of its real deviations (a false break about 1 point in 1,000)
    max_backlog_z: float = Field(4.0, gt=0)
    max_points: int = Field(ge=1, le=12)
    tolerance: float = Field(0.1, gt=0, lt=1)
    budget_s: float = Field(gt=0)
    confirm_repeats: int = Field(1, ge=0, le=5)
    confirm_window: float = Field(2.0, ge=1, le=10)
    # rates the confirm runs at most (the first is the search's capacity): where one breaks it goes on below
    confirm_rates: int = Field(4, ge=1, le=12)
    # tokens a second one client process streams at most: a point's load is split over as many as its
    # stream needs. vLLM's benchmark client spends 35-70 us of CPU a streamed token (bench/client_cost.py,
    # docs/bench.md): one core saturates near 15,000-30,000 a second, which one H200 exceeds on a 1.5B model
    client_tokens_per_s: float = Field(5000.0, gt=0)

    @model_validator(mode="after")
    def _names_and_sizes(self):
        for kind, names in (("workloads", [w.name for w in self.workloads]), ("grid", [c.name for c in self.grid])):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind}: names must be unique (got {', '.join(names)})")
        known = {w.name for w in self.workloads}
        for config in self.grid:
            for name in [*(config.workloads or []), *config.first_rates]:
                if name not in known:
                    raise ValueError(f"grid: {config.name}: workload {name!r} is not one of {', '.join(sorted(known))}")
        for w in self.workloads:
            if not any(c.measures(w.name) for c in self.grid):
                raise ValueError(f"grid: no config measures workload {w.name}")
        return self


Profile.model_rebuild()  # its capacity section is defined after it


def load_profile(path: str | Path) -> Profile:
    return _validate(Profile, Path(path))
