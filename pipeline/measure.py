"""make measure, one variant: eval, then bench, on one vLLM server where their settings agree.

    python -m pipeline.measure VARIANT --suites eval/*.yaml ... --profile bench/PROFILE.yaml

`make eval` and `make bench` each start a server of their own; run one after the other on a variant they
start two, and a start is most of what a short eval costs (a minute on a GPU, half of one on two CPU
cores). Here the server is bench's, started with the profile's settings (what the bench measures and
publish writes into serve.yaml), and eval runs on it first: eval then measures the variant as it is
served, with the profile's batch limits. Eval's own needs go on top where they change nothing a bench
figure depends on (the log-probabilities its fidelity suites ask for, vLLM's sampling defaults). Where
eval needs a server the profile does not give (a context longer than its max_model_len, data-parallel
ranks, other GPUs per rank, whole prefills), eval and bench each start their own, as make eval and
make bench do, and the line printed says which setting differed.

The one module that runs both stages: neither imports the other, and what they write is what
make eval and make bench write (eval/, bench.json), with `server_shared_with_eval` in bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

from pipeline import exits
from pipeline.bench.levels import server_command
from pipeline.bench.variant import bench_variant, check_benchable, check_port, server_env, write_result
from pipeline.evaluate.generate import served_by
from pipeline.evaluate.options import EvalSettings, suite_settings
from pipeline.evaluate.run import EvalJob, evaluate_job, prepare, run_lm_eval_tasks, run_on
from pipeline.quiet import quiet
from pipeline.schema import Bench, BenchFailure, ConfigError, Profile, load_profile
from pipeline.serving import (
    Server,
    cpu_dtype,
    engine_flags,
    free_port,
    on_gpu,
    parallel_plan,
)
from pipeline.settings import environment_value
from pipeline.staging import staging_dir


def profile_dtype(profile: Profile) -> str:
    return cpu_dtype() if profile.dtype == "auto" and not on_gpu() else profile.dtype


def why_not_shared(job: EvalJob, profile: Profile, dtype: str | None) -> str | None:
    """The setting in which eval's server must differ from the profile's; None: one server serves both."""
    if not job.plan.suite_paths:
        return "the suites are lm-eval's only, which start servers of their own"
    if job.engine.replicas != 1:
        return f"eval runs {job.engine.replicas} data-parallel ranks (DP), the bench one server"
    if job.engine.tp != profile.tensor_parallel_size:
        return f"TP: eval {job.engine.tp} GPUs a rank, the profile {profile.tensor_parallel_size}"
    if job.plan.longest > profile.max_model_len:
        return (
            f"eval's longest request is {job.plan.longest} tokens, the profile's max_model_len {profile.max_model_len}"
        )
    if "enable_chunked_prefill" in job.engine.args:
        return "sampled suites on a CPU need whole prefills (no chunked prefill), the bench does not"
    if dtype is not None and dtype != profile_dtype(profile):
        return f"EVAL_DTYPE={dtype}, the profile's dtype {profile_dtype(profile)}"
    return None


def on_profile_server(job: EvalJob, profile: Profile) -> dict:
    """Eval's engine arguments as the profile's server has them (what results.json records), and the
    flags eval adds to that server: the top-k its fidelity suites ask for, vLLM's sampling defaults
    (eval's requests rely on them, as on its own server)."""
    args = {k: v for k, v in job.engine.args.items() if k in ("model", "seed", "max_logprobs", "kv_cache_dtype")}
    args |= dict(
        dtype=profile_dtype(profile),
        max_model_len=profile.max_model_len,
        max_num_seqs=profile.max_num_seqs,
        enforce_eager=profile.enforce_eager,
        tensor_parallel_size=profile.tensor_parallel_size,
        data_parallel_size=1,
        **({"gpu_memory_utilization": profile.gpu_memory_utilization} if on_gpu() else {}),
    )
    job.settings = dataclasses.replace(job.settings, dtype=args["dtype"])
    job.engine.args, job.engine.eager = args, profile.enforce_eager
    return {"max_logprobs": args["max_logprobs"], "generation_config": "vllm"}


def measure(job: EvalJob, profile: Profile, profile_path: Path, port: int | None, dtype: str | None):
    """Eval (into job.dest), then the bench of the same variant: a Bench, or the BenchFailure of a bench
    that failed after eval was written (an eval that fails raises)."""
    variant = job.plan.variant
    exits.doing(f"evaluating {variant} (make measure)", EVAL_INTACT)
    why = why_not_shared(job, profile, dtype)
    if why is not None:
        print(f"{variant.name}: eval and bench on servers of their own: {why}", flush=True)
        evaluate_job(job)
        exits.doing(f"benchmarking {variant} (make measure)", BENCH_INTACT)
        return bench_or_failure(lambda: bench_variant(variant, profile, profile_path, port), variant)
    print(f"{variant.name}: one server for eval and bench, with {profile_path}'s settings", flush=True)
    extra = on_profile_server(job, profile)
    port = port or free_port()
    cmd = server_command(variant, profile, port) + engine_flags(extra)
    log_path = variant.parent / f".bench-{variant.name}.log"  # where bench reads its memory figures
    with contextlib.ExitStack() as stack:
        with staging_dir(job.dest) as tmp:  # eval's files move in before the bench reads them (from_eval)
            lm_eval = run_lm_eval_tasks(job.plan, job.settings.limit, tmp)  # before the server takes the device
            server = stack.enter_context(Server(cmd, port, log_path, profile.startup_timeout_s, server_env(profile)))
            run_on(job, served_by(server, job.engine.args, str(variant)), lm_eval, tmp)
        print(f"{job.dest}: written", flush=True)
        exits.doing(f"benchmarking {variant} (make measure)", BENCH_INTACT)
        return bench_or_failure(lambda: bench_variant(variant, profile, profile_path, port, server), variant)


def bench_or_failure(bench, variant: Path) -> Bench | BenchFailure:
    """As make bench records a variant whose bench failed: its error, in one line."""
    try:
        return bench()
    except (ConfigError, RuntimeError, OSError, ValueError) as e:
        print(f"error: {variant}: {e}", file=sys.stderr, flush=True)
        return BenchFailure(variant=variant.name, error=str(e))


def main(argv=None) -> int:
    quiet()
    p = argparse.ArgumentParser(
        prog="python -m pipeline.measure", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("variant", type=Path, help="artifacts/<model>/<variant>")
    suite_settings(p)
    p.add_argument("--dtype", default=environment_value("EVAL_DTYPE"), help="unset: the profile's")
    p.add_argument("--profile", type=Path, required=True, help="bench/*.yaml")
    p.add_argument("--port", type=int, default=environment_value("BENCH_PORT", int))
    p.set_defaults(tp=None)  # TP unset: the profile's, for eval's server as for bench's
    args = p.parse_args(argv)
    variant = args.variant
    try:
        settings = EvalSettings.from_args(args)
        profile = load_profile(args.profile)
        if args.tp is not None:
            profile = profile.model_copy(update={"tensor_parallel_size": args.tp})
        tp = profile.tensor_parallel_size
        parallel_plan(1, tp)
        check_port(args.port)  # before eval's minutes
        job = prepare(variant, dataclasses.replace(settings, dtype=args.dtype or profile_dtype(profile), tp=tp))
        check_benchable(job.plan.manifest)  # the bench's refusal, before eval's minutes
        result = measure(job, profile, args.profile, args.port, args.dtype)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, ValueError) as e:  # eval's: nothing of this run was written
        print(f"error: {variant}: {e}", file=sys.stderr, flush=True)
        return 1
    if write_result(variant, result):  # as make bench: a failed bench keeps an earlier good bench.json
        print(f"{variant / 'bench.json'}: written")
    return 0 if isinstance(result, Bench) else 1


# What an interruption leaves: staging_dir moves eval/ in whole, write_result writes bench.json once the bench is over
EVAL_INTACT = (
    "its earlier eval/ and bench.json are untouched and nothing is half-written: each is written when complete"
)
BENCH_INTACT = "its eval/ is written; its earlier bench.json is untouched: bench.json is written when the bench is over"

if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import this module
    exits.run("measure", main, EVAL_INTACT, vllm_in_process=True)
