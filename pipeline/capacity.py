"""Capacity at an SLO: the highest request rate one server holds while every latency target of a workload
is met, for each serving config of a bench profile's grid, and the config that holds most.

Called by make bench (pipeline/bench/capacity_grid.py) where the profile has a `capacity:` section
(schema.CapacitySearch).
The load is vLLM's own serving benchmark (what `vllm bench serve` runs: random prompts at the workload's
shapes, Poisson or gamma arrivals, per-request goodput), called in this process through its public
argument parser and entry point, and read back from the result file it saves (--save-result). Per config
and workload:
  1. a warm-up run at the workload's shapes, every request at once (discarded): the first load after a
     server starts carries compilation and allocation spikes
  2. a saturation run (saturation_requests at once): its request throughput S is the ceiling
  3. Poisson rates S/2 (S where the saturation run met the SLO), halved while the SLO breaks, then
     bisection between the highest rate that held and the lowest that broke, until they are within
     `tolerance`, max_points are spent or budget_s is.
The capacity is the highest rate measured at which the SLO held.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.figure_names import LATENCY_KEYS, LATENCY_LABELS, LATENCY_METRICS, PERCENTILES, parse_latency_key
from pipeline.schema import CapacitySearch, Profile, ServingConfig, Workload

# vLLM's goodput takes per-request targets for these three only
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


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


# ----------------------------------------------------------------------------------- one point
def point_requests(search: CapacitySearch, rate: float) -> int:
    return max(search.min_requests, min(search.max_requests, math.ceil(rate * search.point_duration_s)))


def slo_broken(workload: Workload, latency: dict[str, float], num_prompts: int, completed: int) -> list[str]:
    """Each target of the workload's SLO that a point missed, one line each (empty: it held)."""
    broken = []
    if completed < num_prompts:
        broken.append(f"{num_prompts - completed} of {num_prompts} requests failed")
    for key, target in workload.slo.items():
        value = latency.get(key)
        if value is None:
            broken.append(f"{key}: not measured")
        elif value > target:
            broken.append(f"{key} {value:.1f} > {target:g}")
    return broken


def bench_serve_args(
    base_url: str,
    model: str,
    tokenizer: str,
    workload: Workload,
    rate: float | None,
    num_prompts: int,
    seed: int,
    result_dir: Path,
    result_name: str,
    dataset: Path | None = None,
) -> list[str]:
    """`vllm bench serve`'s arguments for one point (rate None: every request at once); dataset: the
    from_eval workload's prompts (eval_dataset)."""
    args = ["--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", tokenizer]
    if workload.from_eval is not None:
        # eval's prompts are chat-templated already; output_tokens per line (custom-output-len -1)
        args += ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1"]
        args += ["--skip-chat-template"]
    else:
        args += ["--dataset-name", "random", "--random-input-len", str(workload.input_len)]
        args += ["--random-output-len", str(workload.output_len), "--random-range-ratio", str(workload.range_ratio)]
    args += ["--num-prompts", str(num_prompts), "--seed", str(seed), "--ignore-eos", "--disable-tqdm"]
    args += ["--request-rate", "inf" if rate is None else f"{rate:.6g}", "--burstiness", str(workload.burstiness)]
    args += ["--percentile-metrics", ",".join(LATENCY_METRICS)]
    args += ["--metric-percentiles", ",".join(map(str, PERCENTILES))]
    goodput = [f"{m}:{t:g}" for key, t in workload.slo.items() if (m := parse_latency_key(key)[1]) in GOODPUT_METRICS]
    if goodput:
        args += ["--goodput", *goodput]
    args += ["--save-result", "--result-dir", str(result_dir), "--result-filename", result_name]
    return args


def run_point(
    base_url: str,
    model: str,
    tokenizer: str,
    workload: Workload,
    rate: float | None,
    num_prompts: int,
    *,
    kind: str,
    seed: int,
    result_dir: Path,
    timeout_s: float,
    log: Path,
    api_key: str | None = None,
    dataset: Path | None = None,
) -> dict:
    """One run of vLLM's serving benchmark, stopped after timeout_s; its saved result as a CapacityPoint."""
    import json

    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    result_dir.mkdir(parents=True, exist_ok=True)
    name = f"{workload.name}-{kind}-{seed}.json"
    (result_dir / name).unlink(missing_ok=True)
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        bench_serve_args(base_url, model, tokenizer, workload, rate, num_prompts, seed, result_dir, name, dataset)
    )
    t0 = time.time()
    timed_out = False
    # vLLM's client reads the server's API key from OPENAI_API_KEY
    with _environ("OPENAI_API_KEY", api_key), log.open("a") as out, contextlib.redirect_stdout(out):
        try:
            asyncio.run(asyncio.wait_for(main_async(args), timeout_s))
        except TimeoutError:
            timed_out = True
    wall = time.time() - t0
    if timed_out or not (result_dir / name).is_file():
        return timed_out_point(workload, rate, num_prompts, kind, wall, timeout_s)
    return saved_point(json.loads((result_dir / name).read_text()), workload, rate, num_prompts, kind, wall)


def timed_out_point(
    workload: Workload, rate: float | None, num_prompts: int, kind: str, wall: float, timeout_s
) -> dict:
    """The CapacityPoint of a run stopped at its time limit: nothing completed, the SLO broken."""
    return {
        "kind": kind,
        "request_rate": rate,
        "burstiness": workload.burstiness,
        "num_prompts": num_prompts,
        "completed": 0,
        "failed": num_prompts,
        "duration_s": wall,
        "request_throughput": 0.0,
        "output_throughput": 0.0,
        "request_goodput": None,
        "latency_ms": {},
        "slo_broken": [f"stopped after point_timeout_s {timeout_s:g}"],
        "wall_s": round(wall, 2),
        "timed_out": True,
    }


def saved_point(saved: dict, workload: Workload, rate: float | None, num_prompts: int, kind: str, wall: float) -> dict:
    """The CapacityPoint of the result vLLM's benchmark saved, its latency held to the SLO."""
    latency = {key: saved[key] for key in LATENCY_KEYS if saved.get(key) is not None}
    return {
        "kind": kind,
        "request_rate": rate,
        "burstiness": workload.burstiness,
        "num_prompts": num_prompts,
        "completed": saved["completed"],
        "failed": saved.get("failed", num_prompts - saved["completed"]),
        "duration_s": saved["duration"],
        "request_throughput": saved["request_throughput"],
        "output_throughput": saved["output_throughput"],
        "request_goodput": saved.get("request_goodput"),
        "latency_ms": latency,
        "slo_broken": slo_broken(workload, latency, num_prompts, saved["completed"]),
        "wall_s": round(wall, 2),
    }


@contextlib.contextmanager
def _environ(key: str, value: str | None):
    old = os.environ.get(key)
    if value is not None:
        os.environ[key] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


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
def search_capacity(measure: Callable[[float | None, int, str], dict], search: CapacitySearch) -> dict:
    """The search for one config and workload. measure(rate, num_prompts, kind) runs one point (rate None:
    all at once) and returns it as a CapacityPoint dict. Returns the CapacityRun's figures and points."""
    t0 = time.time()
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
    }


def choose(runs: list[dict], grid: list[ServingConfig], workload: str, tolerance: float) -> str:
    """The config with the highest capacity for `workload`; the grid's first unless another beats it by
    more than the search's tolerance (its resolution)."""
    capacity = {r["config"]: r["capacity_rps"] or 0.0 for r in runs if r["workload"] == workload and not r["error"]}
    reference = grid[0].name
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

        found = search_capacity(measure, search)
        runs.append({"workload": workload.name, "config": config, "settings": settings, "error": None, **found})
        cap = found["capacity_rps"]
        cap, sat = found["capacity_rps"], found["saturation_rps"] or 0
        report(
            f" {config} {workload.name}: capacity {'none' if cap is None else f'{cap:.2f}'} req/s at its SLO, "
            f"saturation {sat:.2f} req/s ({len(found['points'])} runs, {found['wall_s']:.0f} s, "
            f"stopped by {found['stopped_by']})"
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
def slo_text(workload: dict) -> str:
    """The SLO as a person reads it: p90 TTFT <= 300 ms, p99 E2E <= 4000 ms (512+-50% in, 256 out)."""
    targets = ", ".join(
        f"p{p} {LATENCY_LABELS[metric]} <= {target:g} ms"
        for (p, metric), target in ((parse_latency_key(key), target) for key, target in workload["slo"].items())
    )
    spread = f"+-{workload['range_ratio']:.0%}" if workload.get("range_ratio") else ""
    arrivals = "Poisson" if workload.get("burstiness", 1) == 1 else f"gamma, burstiness {workload['burstiness']:g}"
    if workload.get("from_eval"):
        lengths = workload.get("lengths") or {}
        p, o = lengths.get("prompt_tokens") or {}, lengths.get("output_tokens") or {}
        shapes = (
            f"eval's {workload['from_eval']} prompts and output lengths, {lengths.get('items')} items: "
            f"in p50 {p.get('p50')} [p10-p90 {p.get('p10')}-{p.get('p90')}], out p50 {o.get('p50')} "
            f"[{o.get('p10')}-{o.get('p90')}, max {o.get('max')}] tokens"
        )
    else:
        shapes = f"{workload['input_len']}{spread} tokens in, {workload['output_len']}{spread} out"
    return f"{targets} ({shapes}, {arrivals} arrivals)"


def run_of_chosen_config(capacity: dict, workload: str) -> dict | None:
    """The CapacityRun of the config chosen for `workload` in a bench.json's capacity section, whether or
    not any rate held; None where there is none."""
    config = capacity["chosen"].get(workload)
    return next((r for r in capacity["runs"] if r["workload"] == workload and r["config"] == config), None)


def chosen_run(capacity: dict, workload: str | None = None) -> tuple[dict, dict] | None:
    """(workload, the chosen config's CapacityRun) of a bench.json's capacity section; workload None: the
    first. None where that workload was not measured or its chosen config holds no rate."""
    if not capacity:
        return None
    workloads = {w["name"]: w for w in capacity["workloads"]}
    name = workload or capacity["workloads"][0]["name"]
    if name not in workloads:
        return None
    run = run_of_chosen_config(capacity, name)
    if run is None or run.get("capacity_rps") is None:
        return None
    return workloads[name], run
