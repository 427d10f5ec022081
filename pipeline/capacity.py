"""Capacity at an SLO: the highest request rate one server holds while every latency target of a workload
is met, for each serving config of a bench profile's grid, and the config that holds most.

Called by make bench (pipeline/bench/capacity_grid.py) where the profile has a `capacity:` section
(schema.CapacitySearch).
The load is vLLM's own serving benchmark (what `vllm bench serve` runs: random prompts at the workload's
shapes, Poisson or gamma arrivals, per-request goodput), called in this process through its public
argument parser and entry point, and read back from the result file it saves (--save-result): one such
point is pipeline/capacity_point.py. Per config and workload:
  1. a warm-up run at the workload's shapes, every request at once (discarded): the first load after a
     server starts carries compilation and allocation spikes
  2. a saturation run (saturation_requests at once): its request throughput S is the ceiling
  3. Poisson rates S/2 (S where the saturation run met the SLO), halved while the SLO breaks, then
     bisection between the highest rate that held and the lowest that broke, until they are within
     `tolerance`, max_points are spent or budget_s is.
  4. with the profile's confirm_repeats, the rate found is run again with new seeds
     (pipeline/capacity_spread.py): the run-to-run spread of its goodput and SLO figures, and where a
     repeat breaks the SLO the capacity falls back to the next-lower rate that held in every run, or none.
The capacity is the highest rate measured at which the SLO held (in every run of it, with repeats).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pipeline.capacity_point import bench_serve_args as bench_serve_args  # tests call it as capacity.bench_serve_args
from pipeline.capacity_point import point_requests, run_point
from pipeline.capacity_spread import confirm, held_every_run, spread_text
from pipeline.figure_names import LATENCY_LABELS, parse_latency_key
from pipeline.schema import (
    Capacity,
    CapacityRun,
    CapacitySearch,
    MeasuredWorkload,
    Profile,
    ServingConfig,
    Workload,
)
from pipeline.serving import cuda_graph_settings


# ------------------------------------------------------------------------------------- settings
def server_settings(config: ServingConfig, profile: Profile) -> dict:
    """The vLLM flags a config's server runs with, as serve.yaml names them; unset ones are the profile's
    (max-num-seqs, gpu-memory-utilization, max-model-len) or left to vLLM (not listed)."""
    o = config.overrides()
    settings = {
        "max-model-len": profile.max_model_len,
        "max-num-seqs": o.get("max_num_seqs", profile.max_num_seqs),
        "gpu-memory-utilization": o.get("gpu_memory_utilization", profile.gpu_memory_utilization),
    }
    settings |= cuda_graph_settings(settings["max-num-seqs"], profile.enforce_eager)  # as its server runs
    if "max_num_batched_tokens" in o:
        settings["max-num-batched-tokens"] = o["max_num_batched_tokens"]
    for key in ("enable_chunked_prefill", "enable_prefix_caching"):
        if key in o:
            settings[key.replace("_", "-")] = o[key]
    return settings


def extra_flags(config: ServingConfig) -> list[str]:
    """The config's flags that serving.vllm_server_command does not take itself."""
    o, flags = config.overrides(), []
    if "max_num_batched_tokens" in o:
        flags += ["--max-num-batched-tokens", str(o["max_num_batched_tokens"])]
    for key in ("enable_chunked_prefill", "enable_prefix_caching"):
        if key in o:
            flags.append(f"--{'' if o[key] else 'no-'}{key.replace('_', '-')}")
    return flags


# --------------------------------------------------------------------- workloads from eval's samples
def eval_dataset(variant: Path, workload: Workload, max_model_len: int, out: Path) -> dict:
    """A from_eval workload as vLLM's custom dataset: each prompt eval sent the variant (samples_<suite>.jsonl,
    one line per item and seed), with as many output tokens as the variant wrote to it (at least 2, at most
    what max_model_len leaves), written to `out`. Returns the length distribution, for bench.json."""
    import json

    from pipeline.artifacts import read_samples
    from pipeline.schema import ConfigError

    path = variant / "eval" / f"samples_{workload.from_eval}.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"capacity workload {workload.name}: from_eval {workload.from_eval}: no {path}; run make eval with that "
            "suite first, or give the workload input_len and output_len"
        )
    samples = [s for s in read_samples(path) if s.prompt_tokens < max_model_len - 2]
    if not samples:
        raise ConfigError(f"{path}: no prompt shorter than the profile's max_model_len {max_model_len}")
    rows = [(s.prompt, s.prompt_tokens, min(max(2, s.output_tokens), max_model_len - s.prompt_tokens)) for s in samples]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"prompt": p, "output_tokens": n}) + "\n" for p, _, n in rows))
    return {
        "file": str(path),
        "items": len(rows),
        "prompt_tokens": _quantiles([t for _, t, _ in rows]),
        "output_tokens": _quantiles([n for _, _, n in rows]),
    }


def _quantiles(values: list[int]) -> dict:
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p10": at(0.1),
        "p50": at(0.5),
        "p90": at(0.9),
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 1),
    }


# ---------------------------------------------------------------------------------- the search
def search_capacity(
    measure: Callable[[float | None, int, str], dict], search: CapacitySearch, slo: list[str] | None = None
) -> dict:
    """The search for one config and workload, then its confirm runs. measure(rate, num_prompts, kind) runs
    one point (rate None: all at once) and returns it as a CapacityPoint dict; slo: the workload's target
    names, summarised over the repeats. Returns the CapacityRun's figures and points."""
    t0 = time.time()
    found = _search(measure, search, t0)
    found |= confirm(measure, search.confirm_repeats, found, slo or [])
    found["wall_s"] = round(time.time() - t0, 1)
    return found


def _search(measure: Callable[[float | None, int, str], dict], search: CapacitySearch, t0: float) -> dict:
    points = [measure(None, search.warmup_requests, "warmup")]
    saturation = measure(None, search.saturation_requests, "saturation")
    points.append(saturation)
    ceiling = saturation["request_throughput"]
    held: float | None = None
    broke: float | None = None
    stopped = "max_points"
    if ceiling <= 0:
        return _run(points, None, None, None, "error", t0)
    # every request at once met the SLO: try the ceiling itself as a Poisson rate first
    rate = ceiling if not saturation["slo_broken"] else ceiling / 2
    for _ in range(search.max_points):
        if time.time() - t0 >= search.budget_s:
            stopped = "budget_s"
            break
        point = measure(rate, point_requests(search, rate), "search")
        points.append(point)
        if point["slo_broken"]:
            broke = rate if broke is None else min(broke, rate)
        else:
            held = rate if held is None else max(held, rate)
        top = broke if broke is not None else ceiling
        if held is not None and top / held - 1 <= search.tolerance:
            stopped = "tolerance"
            break
        rate = rate / 2 if held is None else (held + top) / 2
    return _run(points, held, broke, ceiling, stopped, t0)


def _run(points: list[dict], held, broke, ceiling, stopped: str, t0: float) -> dict:
    return {
        "capacity_rps": held,
        "broke_at_rps": broke,
        "saturation_rps": ceiling,
        "stopped_by": stopped,
        "points": points,
        "wall_s": round(time.time() - t0, 1),
        "confirmed": [],
        "unstable": False,
    }


def choose(runs: list[dict], grid: list[ServingConfig], workload: str, tolerance: float) -> str:
    """The config with the highest capacity for `workload`; the grid's first unless another beats it by
    more than the search's tolerance (its resolution) and that other's capacity held in every confirm run
    (an unstable config never displaces the reference)."""
    reference = grid[0].name
    eligible = [
        r
        for r in runs
        if r["workload"] == workload and not r["error"] and (r["config"] == reference or held_every_run(r))
    ]
    capacity = {r["config"]: r["capacity_rps"] or 0.0 for r in eligible}
    best = max(capacity, key=lambda name: (capacity[name], name == reference), default=reference)
    if capacity.get(best, 0) > capacity.get(reference, 0) * (1 + tolerance):
        return best
    return reference


# ---------------------------------------------------------------------------------- per variant
def measure_server(
    base_url: str,
    model: str,
    tokenizer: str,
    search: CapacitySearch,
    config: str,
    settings: dict,
    out_dir: Path,
    log: Path,
    api_key: str | None = None,
    report: Callable[[str], None] = print,
    datasets: dict[str, Path] | None = None,
) -> list[dict]:
    """Every workload's search against one running server (one config): a CapacityRun dict each.
    datasets: the from_eval workloads' files (eval_dataset), by workload name."""
    runs = []
    for workload in search.workloads:
        seeds = iter(range(1, 1_000_000))

        def measure(rate, n, kind, workload=workload):
            return run_point(
                base_url,
                model,
                tokenizer,
                workload,
                rate,
                n,
                kind=kind,
                seed=next(seeds),  # noqa: B023 (this workload's)
                result_dir=out_dir / config,
                timeout_s=search.point_timeout_s,
                log=log,
                api_key=api_key,
                dataset=(datasets or {}).get(workload.name),
            )

        found = search_capacity(measure, search, list(workload.slo))
        runs.append({"workload": workload.name, "config": config, "settings": settings, "error": None, **found})
        cap, sat = found["capacity_rps"], found["saturation_rps"] or 0
        repeats = spread_text(found)
        report(
            f" {config} {workload.name}: capacity {'none' if cap is None else f'{cap:.2f}'} req/s at its SLO"
            f"{f' ({repeats})' if repeats else ''}, saturation {sat:.2f} req/s ({len(found['points'])} runs, "
            f"{found['wall_s']:.0f} s, stopped by {found['stopped_by']})"
        )
    return runs


def failed_runs(search: CapacitySearch, config: str, settings: dict, error: str) -> list[dict]:
    return [
        {
            "workload": w.name,
            "config": config,
            "settings": settings,
            "capacity_rps": None,
            "broke_at_rps": None,
            "saturation_rps": None,
            "stopped_by": "error",
            "points": [],
            "wall_s": 0.0,
            "error": error,
            "confirmed": [],
            "unstable": False,
        }
        for w in search.workloads
    ]


def summary(
    search: CapacitySearch,
    grid: list[dict],
    runs: list[dict],
    profile: Profile,
    device_name: str,
    vllm_version: str | None,
    wall_s: float,
    lengths: dict[str, dict] | None = None,
) -> dict:
    """bench.json's capacity section (schema.Capacity); lengths: the from_eval workloads' distributions."""
    return {
        "workloads": [
            w.model_dump() | ({"lengths": lengths[w.name]} if w.name in (lengths or {}) else {})
            for w in search.workloads
        ],
        "search": search.model_dump(exclude={"workloads", "grid"}),
        "grid": grid,
        "runs": runs,
        "chosen": {w.name: choose(runs, search.grid, w.name, search.tolerance) for w in search.workloads},
        "device_name": device_name,
        "vllm_version": vllm_version,
        "max_model_len": profile.max_model_len,
        "tensor_parallel_size": profile.tensor_parallel_size,
        "wall_s": round(wall_s, 1),
    }


# ------------------------------------------------------------------------ for report and publish
def slo_text(workload: MeasuredWorkload) -> str:
    """The SLO as a person reads it: p90 TTFT <= 300 ms, p99 E2E <= 4000 ms (512+-50% in, 256 out)."""
    targets = ", ".join(
        f"p{p} {LATENCY_LABELS[metric]} <= {target:g} ms"
        for (p, metric), target in ((parse_latency_key(key), target) for key, target in workload.slo.items())
    )
    spread = f"+-{workload.range_ratio:.0%}" if workload.range_ratio else ""
    arrivals = "Poisson" if workload.burstiness == 1 else f"gamma, burstiness {workload.burstiness:g}"
    if workload.from_eval:
        # workload_lengths' summary: None where eval's samples were not read
        lengths = workload.lengths or {}
        p, o = lengths.get("prompt_tokens") or {}, lengths.get("output_tokens") or {}
        shapes = (
            f"eval's {workload.from_eval} prompts and output lengths, {lengths.get('items')} items: "
            f"in p50 {p.get('p50')} [p10-p90 {p.get('p10')}-{p.get('p90')}], out p50 {o.get('p50')} "
            f"[{o.get('p10')}-{o.get('p90')}, max {o.get('max')}] tokens"
        )
    else:
        shapes = f"{workload.input_len}{spread} tokens in, {workload.output_len}{spread} out"
    return f"{targets} ({shapes}, {arrivals} arrivals)"


def run_of_chosen_config(capacity: Capacity, workload: str) -> CapacityRun | None:
    """The CapacityRun of the config chosen for `workload` in a bench.json's capacity section, whether or
    not any rate held; None where there is none."""
    config = capacity.chosen.get(workload)  # a workload of another section
    return next((r for r in capacity.runs if r.workload == workload and r.config == config), None)


def chosen_run(capacity: Capacity | None, workload: str | None = None) -> tuple[MeasuredWorkload, CapacityRun] | None:
    """(workload, the chosen config's CapacityRun) of a bench.json's capacity section; workload None: the
    first. None where that workload was not measured or its chosen config holds no rate."""
    if not capacity:
        return None
    workloads = {w.name: w for w in capacity.workloads}
    name = workload or capacity.workloads[0].name
    if name not in workloads:
        return None
    run = run_of_chosen_config(capacity, name)
    if run is None or run.capacity_rps is None:
        return None
    return workloads[name], run
