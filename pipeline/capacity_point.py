"""One point of a capacity search (pipeline/capacity.py): one run of vLLM's serving benchmark (what
`vllm bench serve` runs) at one request rate, called in this process through its public argument parser
and entry point, and read back from the result file it saves as a CapacityPoint, held to the workload's SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from pathlib import Path

from pipeline.figure_names import LATENCY_KEYS, LATENCY_METRICS, PERCENTILES, parse_latency_key
from pipeline.schema import CapacitySearch, Workload

# vLLM's goodput takes per-request targets for these three only
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


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
