"""What a bench profile (bench/*.yaml) may say: shapes, concurrency, and the capacity search at an SLO."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.figure_names import LATENCY_KEY
from pipeline.schema.common import Strict, _validate


class Shape(Strict):
    name: str
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=0)


class Profile(Strict):
    """What to measure and how hard (bench/*.yaml): data, like recipes."""

    description: str
    shapes: list[Shape] = Field(min_length=1)
    concurrency: list[int] = Field(min_length=1)
    prompts_per_level: int = Field(2, ge=1, description="requests per run = max(min_prompts, this x concurrency)")
    min_prompts: int = Field(4, ge=1)
    repeats: int = Field(3, ge=1)
    warmups: int = Field(1, ge=0)
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"  # auto on CPU: bf16 where it has bf16 instructions
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    enforce_eager: bool = False
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # GPU: the slice vLLM may take
    # GPUs one server spans (vLLM's --tensor-parallel-size): for a model one GPU cannot hold, or to see what
    # a second GPU buys in latency; `make bench TP=2` overrides it
    tensor_parallel_size: int = Field(1, ge=1)
    cpu_kv_cache_gib: int = Field(2, gt=0)  # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    memory_budget_gib: float = Field(gt=0, description="the budget for the max-concurrency figure")
    startup_timeout_s: int = Field(600, gt=0)
    hf_baseline_concurrency: list[int] = []
    hf_baseline_repeats: int = Field(1, ge=1)
    capacity: CapacitySearch | None = None  # requests per second at an SLO, and the serving config that holds most


# ---------------------------------------------------------------- capacity at an SLO (bench profiles)
# pipeline/capacity.py searches, per variant and serving config, the highest Poisson request rate at which
# every target of a workload's SLO holds; the grid's best config is what publish writes into serve.yaml.
SLO_KEY = LATENCY_KEY


class Workload(Strict):
    """Requests of one kind and what they must meet: random prompts of input_len +/- range_ratio tokens,
    output_len +/- range_ratio tokens generated (vLLM's random dataset, uniform in that range, EOS
    ignored), or (from_eval: a suite) the prompts eval sent the variant and as many output tokens as it
    wrote to each, from its eval/samples_<suite>.jsonl; arriving as a Poisson process (burstiness 1) or a
    gamma one (below 1: burstier)."""

    name: str = Field(pattern=r"^[\w-]+$")
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
        return self


class ServingConfig(Strict):
    """One point of the grid: vLLM server settings; unset ones are the profile's (max_num_seqs,
    gpu_memory_utilization) or vLLM's own default. The KV cache dtype stays the recipe's: it changes
    what eval measured."""

    name: str = Field(pattern=r"^[\w-]+$")
    max_num_seqs: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if k != "name" and v is not None}


class CapacitySearch(Strict):
    """How the capacity of each config is found (pipeline/capacity.py). Per config and workload: a warm-up
    run at the workload's shapes (all requests at once, discarded), a saturation run (saturation_requests
    at once: the throughput ceiling S), then at most max_points Poisson rates: S/2 (S where the saturation
    run met the SLO), halved while the SLO breaks, then bisection between the highest rate that held and
    the lowest that broke, until they are within `tolerance` of each other. A point sends
    max(min_requests, min(max_requests, rate x point_duration_s)) requests and is stopped (counted as
    broken) after point_timeout_s; a config's search starts no point after budget_s. Then the capacity
    found is run again confirm_repeats times (new seeds, same requests; outside budget_s, so at most
    2 x confirm_repeats x point_timeout_s more): the run-to-run spread, and the capacity kept only where
    it held in every run (pipeline/capacity.py says what happens where it did not)."""

    workloads: list[Workload] = Field(min_length=1)
    grid: list[ServingConfig] = Field(
        min_length=1
    )  # the first is the reference: another wins only by more than tolerance
    warmup_requests: int = Field(ge=1)
    saturation_requests: int = Field(ge=2)
    min_requests: int = Field(ge=4)
    max_requests: int = Field(1000, ge=4)
    point_duration_s: float = Field(gt=0)
    max_points: int = Field(ge=1, le=12)
    tolerance: float = Field(0.1, gt=0, lt=1)
    point_timeout_s: float = Field(gt=0)
    budget_s: float = Field(gt=0)
    confirm_repeats: int = Field(0, ge=0, le=5)

    @model_validator(mode="after")
    def _names_and_sizes(self):
        for kind, names in (("workloads", [w.name for w in self.workloads]), ("grid", [c.name for c in self.grid])):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind}: names must be unique (got {', '.join(names)})")
        if self.max_requests < self.min_requests:
            raise ValueError(f"max_requests: {self.max_requests} is below min_requests {self.min_requests}")
        return self


Profile.model_rebuild()  # its capacity section is defined after it


def load_profile(path: str | Path) -> Profile:
    return _validate(Profile, Path(path))
